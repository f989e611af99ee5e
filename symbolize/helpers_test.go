package symbolize

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/ianlancetaylor/demangle"
	"golang.org/x/sys/unix"
)

// libtorch is Debian's libtorch1.13 (scripts/setup.sh installs it): about
// 120 MB, 35k exported symbols of which 22k functions at distinct addresses.
const libtorch = "/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13"

func requireFile(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%v: run scripts/setup.sh", err)
	}
}

// eagerSymbol is a function symbol as the symbolizer used to read them all:
// debug/elf's Symbols then DynamicSymbols, demangled without parameters.
type eagerSymbol struct {
	value, size uint64
	name        string
}

// readEager is the reference the lazy tables are checked against.
func readEager(t testing.TB, path string) []eagerSymbol {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var syms []eagerSymbol
	seen := map[uint64]bool{}
	for _, read := range []func() ([]elf.Symbol, error){f.Symbols, f.DynamicSymbols} {
		all, _ := read()
		for _, sym := range all {
			if elf.ST_TYPE(sym.Info) != elf.STT_FUNC || sym.Value == 0 || seen[sym.Value] {
				continue
			}
			seen[sym.Value] = true
			syms = append(syms, eagerSymbol{value: sym.Value, size: sym.Size, name: demangle.Filter(sym.Name, demangle.NoParams)})
		}
	}
	sort.Slice(syms, func(i, j int) bool { return syms[i].value < syms[j].value })
	return syms
}

// eagerLookup names vaddr as the eager symbolizer did; i is the symbol's
// position, -1 when none covers vaddr.
func eagerLookup(syms []eagerSymbol, vaddr uint64) (name string, i int) {
	i = sort.Search(len(syms), func(i int) bool { return syms[i].value > vaddr }) - 1
	if i < 0 || (syms[i].size != 0 && vaddr >= syms[i].value+syms[i].size) {
		return "", -1
	}
	return syms[i].name, i
}

// execSegments are a file's executable PT_LOAD segments.
func execSegments(t testing.TB, path string) []elf.ProgHeader {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var segs []elf.ProgHeader
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			segs = append(segs, p.ProgHeader)
		}
	}
	return segs
}

// fakeProcess writes procRoot/PID/maps for a process that maps each file's
// executable segments (as segs gives them) at its base, so that the
// runtime address of ELF address v is base+v; procRoot/PID/root leads to
// "/", where the files are opened.
func fakeProcess(t testing.TB, procRoot string, pid int, bases map[string]uint64, segs map[string][]elf.ProgHeader) {
	t.Helper()
	dir := filepath.Join(procRoot, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for path, base := range bases {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		for _, p := range segs[path] {
			start, end := base+p.Vaddr&^0xfff, base+(p.Vaddr+p.Memsz+0xfff)&^0xfff
			lines = append(lines, fmt.Sprintf("%016x-%016x r-xp %08x %02x:%02x %d %s\n",
				start, end, p.Off&^0xfff, unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino, path))
		}
	}
	slices.Sort(lines) // by start: fixed-width hex
	if err := os.WriteFile(filepath.Join(dir, "maps"), []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/", filepath.Join(dir, "root")); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
}

// smallLibrary is a C++ library of a few named functions, some at one
// address (aliases), built with the given linker flags.
const smallLibrary = `
namespace model {
__attribute__((noinline)) int f0(int x) { return x * 3 + 1; }
__attribute__((noinline)) int f1(int x) { return f0(x) * 5 + 2; }
__attribute__((noinline)) int f2(int x) { return f1(x) * 7 + 3; }
struct Runner {
	__attribute__((noinline)) static int allocate_kv_cache(int x) { return f2(x) + VARIANT; }
};
int run(int x) { return Runner::allocate_kv_cache(x); }
}
extern "C" int alias_of_f0(int) __attribute__((alias("_ZN5model2f0Ei")));
`

// buildLibrary compiles smallLibrary into dir/name; variant makes its code
// (and so its build ID) differ.
func buildLibrary(t testing.TB, dir, name string, variant int, ldflags ...string) string {
	t.Helper()
	src := filepath.Join(dir, name+".cc")
	if err := os.WriteFile(src, []byte(smallLibrary), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	args := append([]string{"-O1", "-shared", "-fPIC", fmt.Sprintf("-DVARIANT=%d", variant), "-o", out, src}, ldflags...)
	if msg, err := exec.Command("c++", args...).CombinedOutput(); err != nil {
		t.Fatalf("c++: %v\n%s", err, msg)
	}
	return out
}

func copyFile(t testing.TB, from, to string) string {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return to
}

// functionAddrs are the return addresses (runtime, +1) of each function
// symbol's first byte in a file mapped at base.
func functionAddrs(syms []eagerSymbol, base uint64) []uint64 {
	addrs := make([]uint64, len(syms))
	for i, s := range syms {
		addrs[i] = base + s.value + 1
	}
	return addrs
}

func functionNames(frames []Frame) []string {
	names := make([]string, len(frames))
	for i, f := range frames {
		names[i] = f.Function
	}
	return names
}

func eagerNames(syms []eagerSymbol) []string {
	names := make([]string, len(syms))
	for i, s := range syms {
		names[i] = s.name
	}
	return names
}

// cachedNameBytes is what NameBytes must say once the given symbols were hit.
func cachedNameBytes(syms []eagerSymbol, hit map[int]bool) int64 {
	var n int64
	for i := range hit {
		n += int64(len(syms[i].name)) + nameEntryBytes
	}
	return n
}

// twoCopies builds a small library (with ldflags) and copies it: two files
// of one build. It returns their paths, their executable segments and the
// library's symbols.
func twoCopies(t testing.TB, ldflags ...string) (lib, other string, segs map[string][]elf.ProgHeader, syms []eagerSymbol) {
	t.Helper()
	dir := t.TempDir()
	lib = buildLibrary(t, dir, "liba.so", 1, ldflags...)
	other = copyFile(t, lib, filepath.Join(dir, "libb.so"))
	segs = map[string][]elf.ProgHeader{lib: execSegments(t, lib), other: execSegments(t, other)}
	return lib, other, segs, readEager(t, lib)
}
