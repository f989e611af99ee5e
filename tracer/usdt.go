// The usdt_sites table: each PyTorch USDT site and the arguments BPF reads
// there, stored once per library file.

package tracer

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/gpu-mem/gpu-mem/usdt"
)

// allocatorSites are one library's USDT sites, stored in usdt_sites once
// however many processes they are attached for, through whatever path
// (/proc/PID/root/... differs from process to process).
type allocatorSites struct {
	addrs, refs, cookies []uint64
	functions            map[string]allocatorFunction // the allocator's own functions probed, by name
}

// fileID is a file's device and inode.
type fileID struct{ dev, ino uint64 }

// allocatorSites reads the library's USDT sites and stores them in
// usdt_sites, the first time; t.mu is held.
func (t *Tracer) allocatorSites(path string) (allocatorSites, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return allocatorSites{}, fmt.Errorf("stat %s: %w", path, err)
	}
	id := fileID{st.Dev, st.Ino}
	if s, ok := t.sites[id]; ok {
		return s, nil
	}
	probes, err := usdt.Read(path)
	if err != nil {
		return allocatorSites{}, err
	}
	var s allocatorSites
	for _, p := range probes {
		site, ok := usdtSite(p)
		if !ok {
			continue
		}
		if max := t.objs.UsdtSites.MaxEntries(); t.usdtSites >= max {
			return allocatorSites{}, fmt.Errorf("%s: more than %d USDT sites in all", path, max)
		}
		if err := t.objs.UsdtSites.Put(t.usdtSites, site); err != nil {
			return allocatorSites{}, fmt.Errorf("store USDT site: %w", err)
		}
		s.addrs, s.refs, s.cookies = append(s.addrs, p.Offset), append(s.refs, p.SemaphoreOffset), append(s.cookies, uint64(t.usdtSites))
		t.usdtSites++
	}
	if len(s.addrs) == 0 {
		return allocatorSites{}, fmt.Errorf("%s: %w", path, ErrNoProbes)
	}
	if s.functions, err = allocatorFunctions(path); err != nil {
		return allocatorSites{}, err
	}
	if t.sites == nil {
		t.sites = map[fileID]allocatorSites{}
	}
	t.sites[id] = s
	return s, nil
}

// usdtSite describes a pytorch:malloc or pytorch:free site for BPF: the
// arguments it reads, pointer first.
func usdtSite(p usdt.Probe) (gpumemGpumemUsdtSite, bool) {
	var site gpumemGpumemUsdtSite
	want := map[string]int{"malloc": 3, "free": 1}[p.Name] // malloc(ptr, device, size, stream)
	if p.Provider != "pytorch" || want == 0 || len(p.Args) < want {
		return site, false
	}
	site.Op = uint16(gpumemGpumemOpGPUMEM_OP_TENSOR_FREE)
	if p.Name == "malloc" {
		site.Op = uint16(gpumemGpumemOpGPUMEM_OP_TENSOR_ALLOC)
	}
	for i, a := range p.Args[:want] {
		// usdt.ArgKind has the values of enum gpumem_usdt_arg_kind.
		site.Args[i].Value, site.Args[i].Reg, site.Args[i].Kind = a.Value, a.Reg, uint8(a.Kind)
		site.Args[i].Size = a.Size
		if a.Signed {
			site.Args[i].IsSigned = 1
		}
	}
	return site, true
}
