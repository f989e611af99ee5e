// Package symbolize turns user return addresses into function names, from
// the ELF symbol tables (.symtab and .dynsym) of the files a process maps.
package symbolize

import (
	"bufio"
	"bytes"
	"cmp"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/ianlancetaylor/demangle"
	"golang.org/x/sys/unix"

	"github.com/gpu-mem/gpu-mem/discover"
)

// Frame is one symbolized stack frame: native, or Python (File and Line set,
// Function the qualified name).
type Frame struct {
	Function string // demangled name; empty when no symbol covers the address
	Module   string // path of the mapped file, as the process sees it
	Address  uint64 // address in the file's ELF address space (runtime address if no module)
	File     string // source file, for Python frames
	Line     int64  // source line, for Python frames; 0 when unknown
}

// Name is the frame as profiles show it: the function, or module+0xaddress
// when the address has no symbol.
func (f Frame) Name() string {
	if f.Function != "" {
		return f.Function
	}
	if f.Module == "" {
		return fmt.Sprintf("[unknown]+0x%x", f.Address)
	}
	return fmt.Sprintf("%s+0x%x", filepath.Base(f.Module), f.Address)
}

// Symbolizer caches each process's mappings and each file's symbols (by
// device and inode, so a library shared by many processes is read once).
type Symbolizer struct {
	procRoot string

	mu    sync.Mutex
	procs map[uint32][]mapping
	files map[string]*elfSymbols
}

type mapping struct {
	discover.Mapping
	file *elfSymbols // nil until needed
}

// New returns a Symbolizer reading processes under procRoot (/proc).
func New(procRoot string) *Symbolizer {
	return &Symbolizer{procRoot: procRoot, procs: map[uint32][]mapping{}, files: map[string]*elfSymbols{}}
}

// Frames symbolizes return addresses of process pid, innermost first. Each
// address is looked up one byte back, inside the call instruction. The
// frames end before the first address outside executable memory: no return
// address can be there, so the frame-pointer chain had gone through code
// built without frame pointers, and nothing beyond it is a caller. A
// process whose maps cannot be read keeps every address, unresolved.
func (s *Symbolizer) Frames(pid uint32, addrs []uint64) []Frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	frames := make([]Frame, 0, len(addrs))
	reloaded := false
	for _, addr := range addrs {
		m := s.lookupMapping(pid, addr-1)
		if m == nil && !reloaded {
			// Libraries loaded since the maps were read (dlopen).
			s.loadMaps(pid)
			reloaded = true
			m = s.lookupMapping(pid, addr-1)
		}
		if m == nil && len(s.procs[pid]) > 0 {
			break
		}
		frames = append(frames, s.frame(pid, m, addr-1))
	}
	return frames
}

// Track reads a process's mappings now, if they are not cached: the
// process may be gone by the time its stacks are symbolized.
func (s *Symbolizer) Track(pid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.procs[pid]; !ok {
		s.loadMaps(pid)
	}
}

// Forget drops what is cached for a process that exited.
func (s *Symbolizer) Forget(pid uint32) {
	s.mu.Lock()
	delete(s.procs, pid)
	s.mu.Unlock()
}

func (s *Symbolizer) frame(pid uint32, m *mapping, addr uint64) Frame {
	if m == nil {
		return Frame{Address: addr}
	}
	if !strings.HasPrefix(m.Path, "/") {
		// Anonymous executable memory: code generated at run time.
		return Frame{Module: cmp.Or(m.Path, "[anon]"), Address: addr - m.Start}
	}
	if m.file == nil {
		m.file = s.open(pid, m)
	}
	f := Frame{Module: m.Path, Address: addr - m.Start + m.Offset}
	if m.file != nil {
		if vaddr, ok := m.file.fileOffsetToVaddr(addr - m.Start + m.Offset); ok {
			f.Address = vaddr
			f.Function = m.file.lookup(vaddr)
		}
	}
	return f
}

func (s *Symbolizer) lookupMapping(pid uint32, addr uint64) *mapping {
	maps, ok := s.procs[pid]
	if !ok {
		maps = s.loadMaps(pid)
	}
	i := sort.Search(len(maps), func(i int) bool { return maps[i].End > addr })
	if i < len(maps) && maps[i].Start <= addr {
		return &maps[i]
	}
	return nil
}

func (s *Symbolizer) loadMaps(pid uint32) []mapping {
	data, err := os.ReadFile(filepath.Join(s.procRoot, strconv.Itoa(int(pid)), "maps"))
	if err != nil {
		// Gone: keep what was cached, the process's frames resolve from it.
		return s.procs[pid]
	}
	var maps []mapping
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if m, ok := discover.ParseMapsLine(sc.Text()); ok && len(m.Perms) > 2 && m.Perms[2] == 'x' {
			maps = append(maps, mapping{Mapping: m})
		}
	}
	s.procs[pid] = maps
	return maps
}

// open reads a mapped file's symbols once per device and inode. The file is
// opened through /proc/PID/map_files, which reaches files in containers and
// files replaced on disk since they were mapped; once the process is gone,
// at its path, if the file there is still the one that was mapped.
func (s *Symbolizer) open(pid uint32, m *mapping) *elfSymbols {
	id := m.Dev + "/" + strconv.FormatUint(m.Inode, 10)
	if f, ok := s.files[id]; ok {
		return f
	}
	paths := []string{
		filepath.Join(s.procRoot, strconv.Itoa(int(pid)), "map_files", fmt.Sprintf("%x-%x", m.Start, m.End)),
		filepath.Join(s.procRoot, strconv.Itoa(int(pid)), "root", m.Path),
	}
	if sameFile(m.Path, m.Dev, m.Inode) {
		paths = append(paths, m.Path)
	}
	var syms *elfSymbols
	for _, p := range paths {
		if f, err := readELFSymbols(p); err == nil {
			syms = f
			break
		}
	}
	// A file that cannot be read is remembered too: its frames stay
	// module+offset instead of being retried on every stack.
	s.files[id] = syms
	return syms
}

type symbol struct {
	value, size uint64
	name        string
}

type elfSymbols struct {
	loads   []elf.ProgHeader
	symbols []symbol // sorted by value
}

func readELFSymbols(path string) (*elfSymbols, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	e := &elfSymbols{}
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			e.loads = append(e.loads, p.ProgHeader)
		}
	}
	seen := map[uint64]bool{}
	for _, read := range []func() ([]elf.Symbol, error){f.Symbols, f.DynamicSymbols} {
		syms, _ := read() // a missing table is not an error: stripped files have none
		for _, sym := range syms {
			if elf.ST_TYPE(sym.Info) != elf.STT_FUNC || sym.Value == 0 || seen[sym.Value] {
				continue
			}
			seen[sym.Value] = true
			e.symbols = append(e.symbols, symbol{value: sym.Value, size: sym.Size, name: demangle.Filter(sym.Name, demangle.NoParams)})
		}
	}
	sort.Slice(e.symbols, func(i, j int) bool { return e.symbols[i].value < e.symbols[j].value })
	return e, nil
}

func (e *elfSymbols) fileOffsetToVaddr(off uint64) (uint64, bool) {
	for _, p := range e.loads {
		if p.Off <= off && off < p.Off+p.Filesz {
			return off - p.Off + p.Vaddr, true
		}
	}
	return 0, false
}

func (e *elfSymbols) lookup(vaddr uint64) string {
	i := sort.Search(len(e.symbols), func(i int) bool { return e.symbols[i].value > vaddr }) - 1
	if i < 0 {
		return ""
	}
	sym := e.symbols[i]
	if sym.size != 0 && vaddr >= sym.value+sym.size {
		return ""
	}
	return sym.name
}

// sameFile says whether path is the file with the device (major:minor, as
// /proc/PID/maps prints it) and inode of a mapping.
func sameFile(path, dev string, inode uint64) bool {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil || st.Ino != inode {
		return false
	}
	return fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev)) == dev
}
