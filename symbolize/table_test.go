package symbolize

import (
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

const base = 0x7f0000000000

func TestSmallLibraryNamesMatchAnEagerRead(t *testing.T) {
	lib := buildLibrary(t, t.TempDir(), "libsmall.so", 1)
	syms := readEager(t, lib)
	root := t.TempDir()
	fakeProcess(t, root, 10, map[string]uint64{lib: base}, map[string][]elf.ProgHeader{lib: execSegments(t, lib)})
	s := New(root)
	frames := s.Frames(10, functionAddrs(syms, base))
	if got, want := functionNames(frames), eagerNames(syms); !slices.Equal(got, want) {
		t.Errorf("names %q, want %q", got, want)
	}
	if !slices.Contains(functionNames(frames), "model::Runner::allocate_kv_cache") {
		t.Errorf("no demangled member function in %q", functionNames(frames))
	}
	for i, f := range frames {
		if f.Address != syms[i].value || f.Module != lib {
			t.Errorf("frame %d: %#x in %s, want %#x in %s", i, f.Address, f.Module, syms[i].value, lib)
		}
	}
	hit := map[int]bool{}
	for i := range syms {
		hit[i] = true
	}
	st, _ := os.Stat(lib)
	want := Stats{Tables: 1, IndexBytes: int64(len(syms)) * entryBytes, NameBytes: cachedNameBytes(syms, hit), MappedBytes: st.Size()}
	if got := s.Stats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	s.Forget(10)
	if got := s.Stats(); got != (Stats{}) {
		t.Errorf("after Forget: %+v", got)
	}
}

// Two copies of one build (two files, one build ID) and two processes of
// one file: one table, held until the last process is forgotten.
func TestProcessesShareATablePerBuildID(t *testing.T) {
	lib, other, segs, syms := twoCopies(t)
	root := t.TempDir()
	fakeProcess(t, root, 1, map[string]uint64{lib: base}, segs)
	fakeProcess(t, root, 2, map[string]uint64{lib: base + 1<<32}, segs)
	fakeProcess(t, root, 3, map[string]uint64{other: base}, segs)
	s := New(root)
	for pid, b := range map[uint32]uint64{1: base, 2: base + 1<<32, 3: base} {
		if got := functionNames(s.Frames(pid, functionAddrs(syms, b))); !slices.Equal(got, eagerNames(syms)) {
			t.Errorf("pid %d: %q", pid, got)
		}
	}
	st, _ := os.Stat(lib)
	if got := s.Stats(); got.Tables != 1 || got.MappedBytes != st.Size() {
		t.Errorf("stats %+v, want one table of %d bytes mapped", got, st.Size())
	}
	if _, ok := s.tables["build-id:"+readBuildID(t, lib)]; !ok {
		t.Errorf("tables %v, want one keyed by the build ID", keys(s))
	}
	for _, pid := range []uint32{1, 3} {
		s.Forget(pid)
		if got := s.Stats().Tables; got != 1 {
			t.Fatalf("after Forget(%d): %d tables", pid, got)
		}
	}
	s.Forget(2)
	if got := s.Stats(); got != (Stats{}) || len(s.files) != 0 {
		t.Errorf("after the last Forget: %+v, files %v", got, s.files)
	}
}

func TestFileWithoutBuildIDKeyedByDeviceAndInode(t *testing.T) {
	lib, other, segs, syms := twoCopies(t, "-Wl,--build-id=none")
	if id := readBuildID(t, lib); id != "" {
		t.Fatalf("built with build ID %s", id)
	}
	root := t.TempDir()
	fakeProcess(t, root, 1, map[string]uint64{lib: base, other: base + 1<<32}, segs)
	fakeProcess(t, root, 2, map[string]uint64{lib: base}, segs)
	s := New(root)
	s.Frames(1, []uint64{base + syms[0].value + 1, base + 1<<32 + syms[0].value + 1})
	s.Frames(2, []uint64{base + syms[0].value + 1})
	key := func(path string) string {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("file:%02x:%02x/%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	}
	want := []string{key(lib), key(other)}
	slices.Sort(want)
	if got := keys(s); !slices.Equal(got, want) {
		t.Errorf("tables %q, want %q", got, want)
	}
	s.Forget(1)
	if got := keys(s); !slices.Equal(got, []string{key(lib)}) {
		t.Errorf("after Forget(1): %q, want %s's alone", got, lib)
	}
	s.Forget(2)
	if got := s.Stats(); got != (Stats{}) {
		t.Errorf("after the last Forget: %+v", got)
	}
}

// Files that are not ELF, cut short, or whose headers lie: no names, no
// panic, nothing held once forgotten.
func TestHostileFilesGiveNoNames(t *testing.T) {
	dir := t.TempDir()
	lib := buildLibrary(t, dir, "libgood.so", 1)
	good, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	segs := execSegments(t, lib)
	syms := readEager(t, lib)
	rng := rand.New(rand.NewPCG(1, 2))
	garbage := make([]byte, 64<<10)
	for i := range garbage {
		garbage[i] = byte(rng.Uint32())
	}
	files := map[string][]byte{
		"empty":                  {},
		"garbage":                garbage,
		"elf magic then garbage": append([]byte("\x7fELF\x02\x01\x01"), garbage...),
	}
	for _, n := range []int{16, 64, 100, 1000, 4096, len(good) / 2, len(good) - 1} {
		files[fmt.Sprintf("cut at %d", n)] = good[:n]
	}
	for name, patch := range sectionLies(t, lib) {
		f := slices.Clone(good)
		patch(f)
		files[name] = f
	}
	for name, data := range files {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, "hostile.so")
			os.Remove(path)
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			root := t.TempDir()
			fakeProcess(t, root, 1, map[string]uint64{path: base}, map[string][]elf.ProgHeader{path: segs})
			s := New(root)
			frames := s.Frames(1, functionAddrs(syms, base))
			for _, f := range frames {
				if f.Function != "" {
					t.Errorf("named %q", f.Function)
				}
			}
			if len(frames) != len(syms) {
				t.Errorf("%d frames, want %d", len(frames), len(syms))
			}
			s.Forget(1)
			if got := s.Stats(); got != (Stats{}) {
				t.Errorf("after Forget: %+v", got)
			}
		})
	}
}

// sectionLies are patches of a good library whose section headers send its
// symbols or their names outside the file, or count more than it holds.
func sectionLies(t *testing.T, lib string) map[string]func([]byte) {
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	shoff := func(data []byte) uint64 { return binary.LittleEndian.Uint64(data[0x28:]) }
	// Offsets in an Elf64_Shdr.
	const offset, size, link = 24, 32, 40
	set := func(field int, value uint64, types ...elf.SectionType) func([]byte) {
		return func(data []byte) {
			for i, s := range f.Sections {
				if slices.Contains(types, s.Type) {
					at := shoff(data) + uint64(i)*64 + uint64(field)
					if field == link {
						binary.LittleEndian.PutUint32(data[at:], uint32(value))
					} else {
						binary.LittleEndian.PutUint64(data[at:], value)
					}
				}
			}
		}
	}
	symtabs := []elf.SectionType{elf.SHT_SYMTAB, elf.SHT_DYNSYM}
	return map[string]func([]byte){
		"huge symbol tables":           set(size, 1<<62, symtabs...),
		"symbol tables past the end":   set(offset, 1<<40, symtabs...),
		"huge string tables":           set(size, 1<<62, elf.SHT_STRTAB),
		"string tables of one byte":    set(size, 1, elf.SHT_STRTAB),
		"names in no string table":     set(link, 0xffff, symtabs...),
		"huge section count":           func(data []byte) { binary.LittleEndian.PutUint16(data[0x3c:], 0xfeff) },
		"section headers past the end": func(data []byte) { binary.LittleEndian.PutUint64(data[0x28:], 1<<40) },
	}
}

// Random bytes flipped in the headers and tables: whatever is named, no
// panic and nothing held once forgotten.
func TestCorruptedLibrariesDoNotPanic(t *testing.T) {
	dir := t.TempDir()
	lib := buildLibrary(t, dir, "libgood.so", 1)
	good, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	segs := execSegments(t, lib)
	syms := readEager(t, lib)
	shoff := binary.LittleEndian.Uint64(good[0x28:])
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 300 {
		data := slices.Clone(good)
		for range 8 {
			// Half in the ELF and program headers and dynamic symbols, half
			// in the section headers.
			at := rng.Uint64N(4096)
			if rng.IntN(2) == 0 {
				at = shoff + rng.Uint64N(uint64(len(good))-shoff)
			}
			data[at] = byte(rng.Uint32())
		}
		path := filepath.Join(dir, fmt.Sprintf("corrupt%d.so", round))
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		root := t.TempDir()
		fakeProcess(t, root, 1, map[string]uint64{path: base}, map[string][]elf.ProgHeader{path: segs})
		s := New(root)
		if frames := s.Frames(1, functionAddrs(syms, base)); len(frames) != len(syms) {
			t.Errorf("round %d: %d frames", round, len(frames))
		}
		s.Forget(1)
		if got := s.Stats(); got != (Stats{}) {
			t.Errorf("round %d: after Forget: %+v", round, got)
		}
		os.Remove(path)
	}
}

// A file truncated while mapped faults (SIGBUS) on the pages gone: the
// table stops naming instead of the agent crashing.
func TestLibraryTruncatedWhileMapped(t *testing.T) {
	dir := t.TempDir()
	lib := buildLibrary(t, dir, "libcut.so", 1)
	segs := map[string][]elf.ProgHeader{lib: execSegments(t, lib)}
	syms := readEager(t, lib)
	root := t.TempDir()
	fakeProcess(t, root, 1, map[string]uint64{lib: base}, segs)
	s := New(root)
	if got := s.Frames(1, []uint64{base + syms[0].value + 1})[0].Function; got != syms[0].name {
		t.Fatalf("before: %q, want %q", got, syms[0].name)
	}
	if err := os.Truncate(lib, 0); err != nil {
		t.Fatal(err)
	}
	if got := s.Frames(1, []uint64{base + syms[1].value + 1})[0].Function; got != "" {
		t.Errorf("named %q from a file cut to nothing", got)
	}
	if got := s.Stats(); got.Tables != 1 || got.IndexBytes != 0 || got.NameBytes != 0 {
		t.Errorf("stats %+v: want the broken table's heap dropped", got)
	}
	for _, tb := range s.tables {
		if !tb.broken {
			t.Error("the table read past its file's end and is not marked broken")
		}
	}
	s.Forget(1)
	if got := s.Stats(); got != (Stats{}) {
		t.Errorf("after Forget: %+v", got)
	}
}

// Past the bound, the least recently used table drops its index and names,
// and builds them again when hit.
func TestBoundTrimsTheLeastRecentlyUsedTable(t *testing.T) {
	dir := t.TempDir()
	libA := buildLibrary(t, dir, "liba.so", 1)
	libB := buildLibrary(t, dir, "libb.so", 2)
	segs := map[string][]elf.ProgHeader{libA: execSegments(t, libA), libB: execSegments(t, libB)}
	symsA, symsB := readEager(t, libA), readEager(t, libB)
	root := t.TempDir()
	baseB := uint64(base + 1<<32)
	fakeProcess(t, root, 1, map[string]uint64{libA: base, libB: baseB}, segs)
	all := func(syms []eagerSymbol) map[int]bool {
		hit := map[int]bool{}
		for i := range syms {
			hit[i] = true
		}
		return hit
	}
	heapA := int64(len(symsA))*entryBytes + cachedNameBytes(symsA, all(symsA))
	heapB := int64(len(symsB))*entryBytes + cachedNameBytes(symsB, all(symsB))
	s := New(root, MaxTableBytes(heapA+heapB-1))

	nameAll := func(syms []eagerSymbol, b uint64) {
		t.Helper()
		if got := functionNames(s.Frames(1, functionAddrs(syms, b))); !slices.Equal(got, eagerNames(syms)) {
			t.Errorf("names %q, want %q", got, eagerNames(syms))
		}
	}
	nameAll(symsA, base)
	if got := s.Stats(); got.IndexBytes+got.NameBytes != heapA {
		t.Errorf("A alone: %+v, want %d bytes", got, heapA)
	}
	nameAll(symsB, baseB)
	if got := s.Stats(); got.Tables != 2 || got.IndexBytes+got.NameBytes != heapB {
		t.Errorf("after B: %+v, want A trimmed, B's %d bytes", got, heapB)
	}
	nameAll(symsA, base)
	if got := s.Stats(); got.Tables != 2 || got.IndexBytes+got.NameBytes != heapA {
		t.Errorf("after A again: %+v, want B trimmed, A's %d bytes", got, heapA)
	}
}

// A file whose index alone would pass the bound is not indexed, so that a
// file made of symbols cannot take the heap.
func TestFileOverTheBoundIsNotIndexed(t *testing.T) {
	lib := buildLibrary(t, t.TempDir(), "libbig.so", 1)
	syms := readEager(t, lib)
	root := t.TempDir()
	fakeProcess(t, root, 1, map[string]uint64{lib: base}, map[string][]elf.ProgHeader{lib: execSegments(t, lib)})
	s := New(root, MaxTableBytes(entryBytes*int64(len(syms)-1)))
	for _, f := range s.Frames(1, functionAddrs(syms, base)) {
		if f.Function != "" || f.Address == 0 {
			t.Errorf("frame %+v: want an address and no name", f)
		}
	}
	if got := s.Stats(); got.Tables != 1 || got.IndexBytes != 0 || got.NameBytes != 0 {
		t.Errorf("stats %+v, want a table with no index", got)
	}
}

// Frames from one goroutine while another tracks and forgets processes of
// the same file: every name right, and nothing held at the end (go test
// -race checks the locking).
func TestFramesWhileProcessesComeAndGo(t *testing.T) {
	lib := buildLibrary(t, t.TempDir(), "libshared.so", 1)
	segs := map[string][]elf.ProgHeader{lib: execSegments(t, lib)}
	syms := readEager(t, lib)
	root := t.TempDir()
	for pid := 1; pid <= 4; pid++ {
		fakeProcess(t, root, pid, map[string]uint64{lib: base}, segs)
	}
	s := New(root)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 400 {
			pid := uint32(1 + i%4)
			if got := functionNames(s.Frames(pid, functionAddrs(syms, base))); !slices.Equal(got, eagerNames(syms)) {
				t.Errorf("pid %d: %q", pid, got)
				return
			}
		}
	}()
	for i := range 400 {
		pid := uint32(1 + i%4)
		s.Track(pid)
		s.Forget(pid)
	}
	wg.Wait()
	for pid := uint32(1); pid <= 4; pid++ {
		s.Forget(pid)
	}
	if got := s.Stats(); got != (Stats{}) {
		t.Errorf("after every Forget: %+v", got)
	}
}

func readBuildID(t testing.TB, path string) string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := f.Section(".note.gnu.build-id")
	if s == nil {
		return ""
	}
	data, err := s.Data()
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(data[16:]) // after namesz, descsz, type and "GNU\0"
}

func keys(s *Symbolizer) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var k []string
	for key := range s.tables {
		k = append(k, key)
	}
	slices.Sort(k)
	return k
}
