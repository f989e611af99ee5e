// PyTorch's caching allocator's probes: its USDT sites and its own
// functions, in one process or in all.

package tracer

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// ErrNoProbes is returned by AttachAllocator for a library without
// PyTorch's USDT probes (a torch built without them).
var ErrNoProbes = errors.New("no pytorch:malloc or pytorch:free USDT probes")

// AllocatorProbes are the probes on one allocator library, for one process
// or for all; Close detaches them.
type AllocatorProbes struct {
	Sites int // USDT sites probed
	// Missing are the allocator's own functions the library lacks, whose
	// changes to the books pass no USDT site and are not followed
	// (docs/pytorch-allocator-books.md), or, for beginAllocateToPool and
	// endAllocateToPool, graphs' pools are not told from the cache: none in
	// torch 2.1 and later.
	Missing []string
	links   []link.Link
}

// Close detaches the probes.
func (p *AllocatorProbes) Close() error {
	closeAll(p.links)
	return nil
}

// AttachAllocator puts probes on the USDT sites of PyTorch's caching
// allocator in the library at path (libc10_cuda.so): every tensor allocated
// and freed, in process pid only, or in every process that maps the library
// when pid is 0. The kernel counts the probes in their semaphores, which
// turns them on, and inserts their traps, only in the processes they are
// attached for: the others pay nothing. Beside them, probes on the
// allocator's own functions, found by name in the library's symbol
// tables, follow the restores and raw frees that pass no USDT site, and the
// threads allocating to a CUDA graph's private pool (tracer.GraphPool). Closing the
// probes detaches them, as closing the tracer does not.
func (t *Tracer) AttachAllocator(path string, pid uint32) (*AllocatorProbes, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sites, err := t.allocatorSites(path)
	if err != nil {
		return nil, err
	}
	ex, err := link.OpenExecutable(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	l, err := ex.UprobeMulti(nil, t.objs.GpumemTensor, &link.UprobeMultiOptions{
		Addresses: sites.addrs, RefCtrOffsets: sites.refs, Cookies: sites.cookies, PID: pid})
	if err != nil {
		return nil, fmt.Errorf("attach USDT probes to %s: %w", path, err)
	}
	p := &AllocatorProbes{Sites: len(sites.addrs), links: []link.Link{l}}
	for _, f := range []struct {
		name         string
		enter, leave *ebpf.Program
	}{
		{restoreFunction, t.objs.GpumemRestoreEnter, t.objs.GpumemRestoreReturn},
		{rawAllocFunction, t.objs.GpumemRawAllocEnter, t.objs.GpumemRawAllocReturn},
		{rawAllocStreamFunction, t.objs.GpumemRawAllocEnter, t.objs.GpumemRawAllocReturn},
		{rawDeleteFunction, t.objs.GpumemRawDelete, nil},
		{poolBeginFunction, t.objs.GpumemPoolBegin, nil},
		{poolEndFunction, t.objs.GpumemPoolEnd, nil},
	} {
		fn, ok := sites.functions[f.name]
		if !ok || f.leave != nil && len(fn.returns) == 0 {
			p.Missing = append(p.Missing, f.name)
			continue
		}
		if err := p.attach(ex, fn, f.enter, f.leave, pid); err != nil {
			p.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return p, nil
}

// oomReportSymbol is c10::reportOutOfMemoryToProfiler(long, unsigned long,
// unsigned long, c10::Device), which PyTorch's CUDA allocator calls before
// it raises out of memory.
const oomReportSymbol = "_ZN3c1027reportOutOfMemoryToProfilerElmmNS_6DeviceE"

// AttachOOMReport probes the out-of-memory report of PyTorch's allocator
// library at path (libc10_cuda.so): c10::reportOutOfMemoryToProfiler, in
// torch's libc10.so beside it, in every process that maps it. Its
// out-of-memory errors are seen so, those of a limit of its own
// (set_per_process_memory_fraction) too, which the driver never sees. It
// runs only when one happens, so it is on without the tensor view.
// Closing the probe detaches it, as closing the tracer does not.
func (t *Tracer) AttachOOMReport(path string) (io.Closer, error) {
	c10 := filepath.Join(filepath.Dir(path), "libc10.so")
	ex, err := link.OpenExecutable(c10)
	if err != nil {
		return nil, fmt.Errorf("PyTorch's out-of-memory report: %w", err)
	}
	l, err := ex.UprobeMulti([]string{oomReportSymbol}, t.objs.GpumemTensorOom, nil)
	if err != nil {
		return nil, fmt.Errorf("PyTorch's out-of-memory report in %s: %w", c10, err)
	}
	return l, nil
}

// attach puts enter on the function's entry and, unless nil, leave on its
// return instructions.
func (p *AllocatorProbes) attach(ex *link.Executable, fn allocatorFunction, enter, leave *ebpf.Program, pid uint32) error {
	l, err := ex.UprobeMulti([]string{fn.symbol}, enter, &link.UprobeMultiOptions{PID: pid})
	if err != nil {
		return fmt.Errorf("attach %s: %w", fn.symbol, err)
	}
	p.links = append(p.links, l)
	if leave == nil {
		return nil
	}
	symbols := make([]string, len(fn.returns))
	for i := range symbols {
		symbols[i] = fn.symbol
	}
	if l, err = ex.UprobeMulti(symbols, leave, &link.UprobeMultiOptions{Offsets: fn.returns, PID: pid}); err != nil {
		return fmt.Errorf("attach the returns of %s: %w", fn.symbol, err)
	}
	p.links = append(p.links, l)
	return nil
}
