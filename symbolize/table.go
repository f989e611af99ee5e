package symbolize

import (
	"cmp"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/ianlancetaylor/demangle"
	"golang.org/x/sys/unix"
)

// table names addresses in one file, shared by every process that maps it.
// The file stays mapped while a process holds the table; its index and
// names live on the heap, are built when a stack first hits the file, and
// may be dropped past the Symbolizer's memory bound, to be built again.
type table struct {
	key        string // "build-id:HEX", or "file:DEV/INODE" for a file without one
	data       []byte // the file, mapped read-only
	elf        *elfFile
	maxEntries int // a file with more functions is not indexed: its index alone would pass the bound

	// Guarded by Symbolizer.mu.
	files []string // the mapped files (fileID) that resolve to this table
	refs  int      // processes holding it
	pins  int      // Frames calls using it now: it is neither dropped nor trimmed
	used  uint64   // Symbolizer.clock at its last use, for the LRU

	mu      sync.Mutex // guards what follows; taken only by a caller that pinned the table
	indexed bool
	broken  bool // reading the mapped file faulted: no more names from it
	index   index
	names   map[int32]string // demangled names of the symbols hit, by index position

	indexBytes, nameBytes atomic.Int64 // read by Stats and the LRU without mu
}

// entry is one function symbol: 16 bytes where the eager reader kept a
// Go string per symbol, demangled or not.
type entry struct {
	addr uint64
	size uint32 // clamped: no function is 4 GiB
	name uint32 // offset in its string table; the top bit picks elfFile.symtabs[1]
}

const (
	entryBytes = 16
	nameTable  = 1 << 31
	// nameEntryBytes is what a cached name costs beyond its bytes: its map
	// key, string header and share of the map's buckets.
	nameEntryBytes = 40
)

type index []entry

// openTable maps a file and reads its headers; the index is built later,
// on the first name asked, if it fits in maxBytes.
func openTable(path, dev string, inode uint64, maxBytes int64) (*table, error) {
	data, err := mapFile(path)
	if err != nil {
		return nil, err
	}
	var e *elfFile
	if err := guard(func() (err error) { e, err = parseELF(data); return err }); err != nil {
		unix.Munmap(data)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	t := &table{key: "file:" + fileID(dev, inode), data: data, elf: e, maxEntries: int(min(maxBytes/entryBytes, math.MaxInt32))}
	if e.buildID != nil {
		t.key = "build-id:" + hex.EncodeToString(e.buildID)
	}
	return t, nil
}

// mapFile maps a regular file read-only. The mapping outlives the
// descriptor, which is closed at once.
func mapFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Size() <= 0 || st.Size() > math.MaxInt {
		return nil, fmt.Errorf("map %s: not a regular file with contents", path)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	return data, nil
}

func fileID(dev string, inode uint64) string {
	return dev + "/" + strconv.FormatUint(inode, 10)
}

// close unmaps the file. The caller makes sure nothing uses the table.
func (t *table) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.trimLocked()
	if t.data != nil {
		unix.Munmap(t.data)
		t.data, t.elf = nil, nil
	}
}

// trim drops the index and names; a later name builds them again.
func (t *table) trim() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.trimLocked()
}

func (t *table) trimLocked() {
	t.indexed, t.index, t.names = false, nil, nil
	t.indexBytes.Store(0)
	t.nameBytes.Store(0)
}

func (t *table) heapBytes() int64 { return t.indexBytes.Load() + t.nameBytes.Load() }

// fileOffsetToVaddr turns an offset in the file into its ELF address.
func (t *table) fileOffsetToVaddr(off uint64) (uint64, bool) {
	for _, p := range t.elf.loads {
		if p.off <= off && off-p.off < p.filesz {
			return off - p.off + p.vaddr, true
		}
	}
	return 0, false
}

// name is the demangled name of the function at vaddr, or "" when no symbol
// covers it. Only the symbols asked for are read and demangled, once each.
func (t *table) name(vaddr uint64) (name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.broken {
		return ""
	}
	// Most frames are of functions named before: found in the index and the
	// cache, on the heap, with no read of the mapped file to guard.
	if t.indexed {
		i, ok := t.index.find(vaddr)
		if !ok {
			return ""
		}
		if name, ok := t.names[int32(i)]; ok {
			return name
		}
	}
	err := guard(func() error {
		name = t.nameLocked(vaddr)
		return nil
	})
	if err != nil {
		// The file changed under its mapping: trust nothing more from it.
		t.broken = true
		t.trimLocked()
		return ""
	}
	return name
}

func (t *table) nameLocked(vaddr uint64) string {
	if !t.indexed {
		t.index = buildIndex(t.elf, t.maxEntries)
		t.indexed = true
		t.names = map[int32]string{}
		t.indexBytes.Store(int64(cap(t.index)) * entryBytes)
	}
	i, ok := t.index.find(vaddr)
	if !ok {
		return ""
	}
	if name, ok := t.names[int32(i)]; ok {
		return name
	}
	e := t.index[i]
	name := demangleName(t.elf.symtabs[e.name/nameTable].name(e.name % nameTable))
	t.names[int32(i)] = name
	t.nameBytes.Add(int64(len(name)) + nameEntryBytes)
	return name
}

// maxNameBytes bounds a demangled name (2^maxNameLog2 bytes). Real names
// without their parameters take hundreds of bytes, the longest template
// kernels a few thousand; a mangled name's back references can double the
// demangled text with every few bytes (300 bytes of name demangle to
// gigabytes), and the file is untrusted.
const (
	maxNameLog2  = 16
	maxNameBytes = 1 << maxNameLog2
)

// demangleName is a symbol's name as frames show it: demangled, without
// the function's parameters, cut at maxNameBytes.
func demangleName(raw string) string {
	return demangle.Filter(raw, demangle.NoParams, demangle.MaxLength(maxNameLog2))
}

// buildIndex reads the function symbols of .symtab, then .dynsym, sorted by
// address. The first symbol at an address is kept, as the eager reader
// did: aliases such as a constructor's C1 and C2 resolve to the first
// listed. The index is sized by a first count of the functions, which the
// file's size bounds (an entry is 16 bytes for a symbol's 16 or 24); past
// maxEntries (a file built to exhaust memory), the file gets no index.
func buildIndex(e *elfFile, maxEntries int) index {
	n := 0
	for _, st := range e.symtabs {
		for i := 1; i < st.count(); i++ {
			if st.symbol(i).isFunction() {
				n++
			}
		}
	}
	if n > maxEntries {
		return nil
	}
	x := make(index, 0, n)
	for which, st := range e.symtabs {
		for i := 1; i < st.count(); i++ {
			sym := st.symbol(i)
			if sym.isFunction() && sym.name < nameTable {
				x = append(x, entry{addr: sym.value, size: uint32(min(sym.size, math.MaxUint32)), name: sym.name + uint32(which)*nameTable})
			}
		}
	}
	slices.SortStableFunc(x, func(a, b entry) int { return cmp.Compare(a.addr, b.addr) })
	x = slices.CompactFunc(x, func(a, b entry) bool { return a.addr == b.addr })
	if len(x) < cap(x) {
		x = append(make(index, 0, len(x)), x...) // aliases removed: do not hold their room
	}
	return x
}

// find is the symbol covering vaddr: the last at or below it, if vaddr is
// inside its size (a symbol without a size covers up to the next).
func (x index) find(vaddr uint64) (int, bool) {
	i := sort.Search(len(x), func(i int) bool { return x[i].addr > vaddr }) - 1
	if i < 0 || (x[i].size != 0 && vaddr-x[i].addr >= uint64(x[i].size)) {
		return 0, false
	}
	return i, true
}

// guard runs f, which reads a mapped file, and turns a panic into an error.
// The file is untrusted input, and a file truncated while mapped faults on
// access (SIGBUS), which SetPanicOnFault turns into a panic: either way one
// bad library must cost its names, not the agent.
func guard(f func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errFault, r)
		}
	}()
	return f()
}

var errFault = errors.New("fault reading a mapped file")
