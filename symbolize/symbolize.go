// Package symbolize turns user return addresses into function names, from
// the ELF symbol tables (.symtab and .dynsym) of the files a process maps.
//
// Libraries such as libtorch carry hundreds of thousands of C++ symbols, and
// a stack hits a handful: a file is mapped, not read; its function symbols
// become a flat index of address, size and name offset when a stack first
// hits the file; a name is read and demangled when a stack hits its symbol.
package symbolize

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

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

// Symbolizer caches each process's mappings and a symbol table per mapped
// file, shared by every process mapping it (keyed by build ID, else by
// device and inode). A table costs its file's mapping until a stack hits
// it; then an index of its function symbols and the names hit, bounded in
// all by MaxTableBytes. A table goes when no process holding it is left.
type Symbolizer struct {
	procRoot string
	maxBytes int64

	mu     sync.Mutex
	procs  map[uint32]*process
	tables map[string]*table // by table key
	files  map[string]*table // by fileID of a mapped file
	clock  uint64            // counts table uses, for the LRU
}

// process is what is cached of one process.
type process struct {
	maps   []mapping       // executable mappings, sorted by address
	read   time.Time       // when the reading of maps began
	tables map[*table]bool // the tables it holds a reference on
}

type mapping struct {
	discover.Mapping
	failed bool   // its file could not be read: frames stay module+offset
	table  *table // its file's, once found: held while the process is
}

// DefaultMaxTableBytes bounds the heap the tables hold (indexes and names)
// unless MaxTableBytes says otherwise. The mapped files are not counted:
// they are page cache, shared with the processes that map them.
const DefaultMaxTableBytes = 64 << 20

// Option configures a Symbolizer.
type Option func(*Symbolizer)

// MaxTableBytes bounds the heap held by the tables' indexes and names. Past
// it, the least recently used tables not in use drop theirs, to be built
// again when a stack hits them. A file whose index alone would pass it is
// not indexed: its frames stay module+address.
func MaxTableBytes(n int64) Option {
	return func(s *Symbolizer) { s.maxBytes = n }
}

// New returns a Symbolizer reading processes under procRoot (/proc).
func New(procRoot string, opts ...Option) *Symbolizer {
	s := &Symbolizer{
		procRoot: procRoot,
		maxBytes: DefaultMaxTableBytes,
		procs:    map[uint32]*process{},
		tables:   map[string]*table{},
		files:    map[string]*table{},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Stats is what the symbol tables hold.
type Stats struct {
	Tables      int   // tables, one per distinct file hit
	IndexBytes  int64 // heap of their address indexes
	NameBytes   int64 // heap of the demangled names kept
	MappedBytes int64 // their files' mappings: page cache, not heap
}

// Stats returns what the tables hold now.
func (s *Symbolizer) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Tables: len(s.tables)}
	for _, t := range s.tables {
		st.IndexBytes += t.indexBytes.Load()
		st.NameBytes += t.nameBytes.Load()
		st.MappedBytes += int64(len(t.data))
	}
	return st
}

// Frames symbolizes return addresses of process pid, innermost first. Each
// address is looked up one byte back, inside the call instruction. The
// frames end before the first address outside executable memory: no return
// address can be there, so the frame-pointer chain had gone through code
// built without frame pointers, and nothing beyond it is a caller. A
// process whose maps cannot be read keeps every address, unresolved.
//
// Files are opened and indexes built without holding the lock Track and
// Forget take.
func (s *Symbolizer) Frames(pid uint32, addrs []uint64) []Frame {
	return s.FramesTaken(pid, addrs, time.Now())
}

// FramesTaken is Frames for addresses taken at taken or before: the maps
// are read again for an address outside them only if they were read before
// taken. Maps read since held every library those addresses could be in,
// so that the stacks whose frame-pointer chain ends in a stray address (a
// libtorch allocation's, on a thread with no Python frames) do not each
// read a process's maps again: thousands of lines in a CUDA process.
func (s *Symbolizer) FramesTaken(pid uint32, addrs []uint64, taken time.Time) []Frame {
	var buf [8]*table // the tables of a stack: a handful
	maps, pinned := s.mappingsOf(pid, addrs, taken, buf[:0])
	frames := make([]Frame, len(maps))
	for i, m := range maps {
		var t *table
		frames[i], t = s.frame(pid, m, addrs[i]-1)
		if t != nil {
			pinned = append(pinned, t)
		}
	}
	s.unpin(pinned)
	return frames
}

// Track reads a process's mappings now, if they are not cached: the
// process may be gone by the time its stacks are symbolized.
func (s *Symbolizer) Track(pid uint32) {
	s.mu.Lock()
	_, cached := s.procs[pid]
	s.mu.Unlock()
	if cached {
		return
	}
	if maps, read, ok := s.readMaps(pid); ok {
		s.mu.Lock()
		s.install(pid, maps, read)
		s.mu.Unlock()
	}
}

// Forget drops what is cached for a process that exited, and the tables no
// process holds any more.
func (s *Symbolizer) Forget(pid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[pid]
	delete(s.procs, pid)
	if p == nil {
		return
	}
	for t := range p.tables {
		t.refs--
		s.dropIfUnused(t)
	}
}

// mappingsOf finds the mapping of each address, up to the first outside
// executable memory (nil entries: the maps could not be read), and pins the
// tables already found for them, each once, appending them to pinned. The
// maps are read again first if an address is in none of those cached
// (libraries loaded since, by dlopen) and they were read before taken.
func (s *Symbolizer) mappingsOf(pid uint32, addrs []uint64, taken time.Time, pinned []*table) ([]*mapping, []*table) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.procs[pid]; (p == nil || p.read.Before(taken)) &&
		slices.ContainsFunc(addrs, func(addr uint64) bool { return s.lookupMapping(pid, addr-1) == nil }) {
		// Read without the lock; installed under it, with the lookups
		// that use them.
		s.mu.Unlock()
		fresh, read, ok := s.readMaps(pid)
		s.mu.Lock()
		if ok {
			s.install(pid, fresh, read)
		}
	}
	maps := make([]*mapping, 0, len(addrs))
	for _, addr := range addrs {
		m := s.lookupMapping(pid, addr-1)
		if m == nil && s.procs[pid] != nil && len(s.procs[pid].maps) > 0 {
			break
		}
		if m != nil && m.table != nil && !slices.Contains(pinned, m.table) {
			pinned = append(pinned, s.use(pid, m.table))
		}
		maps = append(maps, m)
	}
	return maps, pinned
}

// frame names one address; it returns the table it pinned, if any.
func (s *Symbolizer) frame(pid uint32, m *mapping, addr uint64) (Frame, *table) {
	if m == nil {
		return Frame{Address: addr}, nil
	}
	if !strings.HasPrefix(m.Path, "/") {
		// Anonymous executable memory: code generated at run time.
		return Frame{Module: cmp.Or(m.Path, "[anon]"), Address: addr - m.Start}, nil
	}
	f := Frame{Module: m.Path, Address: addr - m.Start + m.Offset}
	t, pinned := m.table, (*table)(nil) // pinned by mappingsOf when found before
	if t == nil {
		t = s.tableOf(pid, m)
		pinned = t
	}
	if t == nil {
		return f, nil
	}
	if vaddr, ok := t.fileOffsetToVaddr(f.Address); ok {
		f.Address = vaddr
		f.Function = t.name(vaddr)
	}
	return f, pinned
}

// lookupMapping is the cached mapping of addr in pid, if any. The caller
// holds s.mu.
func (s *Symbolizer) lookupMapping(pid uint32, addr uint64) *mapping {
	p := s.procs[pid]
	if p == nil {
		return nil
	}
	i := sort.Search(len(p.maps), func(i int) bool { return p.maps[i].End > addr })
	if i < len(p.maps) && p.maps[i].Start <= addr {
		return &p.maps[i]
	}
	return nil
}

// readMaps reads a process's executable mappings, without the lock: the
// file is read while events and other readers go on; read is when the
// reading began. False when it cannot be read (the process gone: what was
// cached stays, its frames resolve from it).
func (s *Symbolizer) readMaps(pid uint32) (maps []mapping, read time.Time, ok bool) {
	read = time.Now()
	data, err := os.ReadFile(filepath.Join(s.procRoot, strconv.Itoa(int(pid)), "maps"))
	if err != nil {
		return nil, read, false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if m, ok := discover.ParseMapsLine(sc.Text()); ok && len(m.Perms) > 2 && m.Perms[2] == 'x' {
			maps = append(maps, mapping{Mapping: m})
		}
	}
	return maps, read, true
}

// install makes maps, read then, the process's mappings, unless those
// cached were read later. The tables it holds stay held: stacks taken
// before a library was unloaded may still name it. The caller holds s.mu.
func (s *Symbolizer) install(pid uint32, maps []mapping, read time.Time) {
	p := s.procs[pid]
	if p == nil {
		p = &process{tables: map[*table]bool{}}
		s.procs[pid] = p
	}
	if read.After(p.read) {
		p.maps, p.read = maps, read
	}
}

// tableOf returns the table of a mapping's file, pinned for the caller, or
// nil when the file cannot be read. A file not seen before is opened
// without the lock held; two callers racing to open one file both open it,
// and the second keeps the first's table.
func (s *Symbolizer) tableOf(pid uint32, m *mapping) *table {
	id := fileID(m.Dev, m.Inode)
	s.mu.Lock()
	t := s.files[id]
	if t != nil || m.failed {
		defer s.mu.Unlock()
		m.table = t
		return s.use(pid, t)
	}
	s.mu.Unlock()

	opened, err := s.open(pid, m)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		m.failed = true
		return nil
	}
	m.table = s.add(id, opened)
	return s.use(pid, m.table)
}

// open maps a mapping's file, through /proc/PID/map_files, which reaches
// files in containers and files replaced on disk since they were mapped;
// once the process is gone, at its path, if the file there is still the
// one that was mapped.
func (s *Symbolizer) open(pid uint32, m *mapping) (*table, error) {
	proc := filepath.Join(s.procRoot, strconv.Itoa(int(pid)))
	paths := []string{
		filepath.Join(proc, "map_files", fmt.Sprintf("%x-%x", m.Start, m.End)),
		filepath.Join(proc, "root", m.Path),
	}
	if sameFile(m.Path, m.Dev, m.Inode) {
		paths = append(paths, m.Path)
	}
	var errs []error
	for _, p := range paths {
		t, err := openTable(p, m.Dev, m.Inode, s.maxBytes)
		if err == nil {
			return t, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("open %s: %w", m.Path, errors.Join(errs...))
}

// add registers a table just opened for file id, unless another file with
// the same build ID, or this same file opened meanwhile, has one already.
func (s *Symbolizer) add(id string, t *table) *table {
	if held := cmp.Or(s.files[id], s.tables[t.key]); held != nil {
		t.close()
		t = held
	} else {
		s.tables[t.key] = t
	}
	if s.files[id] == nil {
		s.files[id] = t
		t.files = append(t.files, id)
	}
	return t
}

// use pins t for the caller and has the process hold it (nil t: nothing).
func (s *Symbolizer) use(pid uint32, t *table) *table {
	if t == nil {
		return nil
	}
	t.pins++
	s.clock++
	t.used = s.clock
	// A process forgotten meanwhile holds nothing: the pin alone keeps the
	// table until the caller is done.
	if p := s.procs[pid]; p != nil && !p.tables[t] {
		p.tables[t] = true
		t.refs++
	}
	return t
}

// unpin ends a Frames call's use of its tables, then keeps the heap within
// the bound.
func (s *Symbolizer) unpin(tables []*table) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range tables {
		t.pins--
		s.dropIfUnused(t)
	}
	s.trimToBound()
}

func (s *Symbolizer) dropIfUnused(t *table) {
	if t.refs > 0 || t.pins > 0 {
		return
	}
	delete(s.tables, t.key)
	for _, id := range t.files {
		delete(s.files, id)
	}
	t.close()
}

// trimToBound drops the indexes and names of the least recently used tables
// not in use, until the heap they hold is within the bound. Each step trims
// one table, so it ends within len(s.tables) steps.
func (s *Symbolizer) trimToBound() {
	var held int64
	for _, t := range s.tables {
		held += t.heapBytes()
	}
	for held > s.maxBytes {
		var oldest *table
		for _, t := range s.tables {
			if t.pins == 0 && t.heapBytes() > 0 && (oldest == nil || t.used < oldest.used) {
				oldest = t
			}
		}
		if oldest == nil {
			return
		}
		held -= oldest.heapBytes()
		oldest.trim()
	}
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
