package main

import (
	"debug/elf"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ianlancetaylor/demangle"
	"golang.org/x/sys/unix"

	"github.com/gpu-mem/gpu-mem/symbolize"
)

// symbolLibs are real large C++ libraries: stacks of PyTorch workloads run
// through libraries like these (libtorch_cuda, cuDNN, cuBLAS), where the
// simulated driver has a handful of symbols. -symbol-libs measures others,
// such as a GPU node's own.
var symbolLibs = []symbolLib{
	{"libtorch_cpu.so.1.13", "/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13"},
	{"libLLVM-19", "/usr/lib/llvm-19/lib/libLLVM-19.so"},
}

type symbolLib struct{ name, path string }

var symbolLibPaths = flag.String("symbol-libs", "", "comma-separated libraries for the symbols section, instead of libtorch_cpu 1.13 and libLLVM-19")

const (
	symbolsPID   = 1
	stackFrames  = 32 // a stack's frames in each library
	symbolsBase  = 0x7f0000000000
	symbolsSpace = 1 << 32 // between the libraries' bases
)

// symbolStack is a stack through some libraries, as a fake /proc shows it.
type symbolStack struct {
	procRoot  string
	paths     []string
	bases     []uint64
	addrs     []uint64 // return addresses, runtime
	functions int      // function symbols in the libraries
}

// symbolsFirstStack measures what naming the first stack costs: a fresh
// Symbolizer maps each library, builds its index and names the frames hit;
// the old way read and demangled every symbol first. Both name the same
// frames the same way (checked), with the files in the page cache.
func symbolsFirstStack(root string) string {
	if *symbolLibPaths != "" {
		symbolLibs = nil
		for _, p := range strings.Split(*symbolLibPaths, ",") {
			symbolLibs = append(symbolLibs, symbolLib{filepath.Base(p), p})
		}
	}
	dir, err := os.MkdirTemp("", "gpumem-bench-symbols")
	check(err)
	defer os.RemoveAll(dir)
	var b strings.Builder
	b.WriteString("A fresh symbolizer names a stack of 32 frames in each library (return addresses spread over its\n")
	b.WriteString("functions), as the agent names the first stack through it: map the file, index its function symbols,\n")
	b.WriteString("demangle the names hit; against reading and demangling every symbol first (eager). Heap held: the live\n")
	b.WriteString("heap after a GC, tables kept; allocated: every byte allocated on the way. Files in the page cache.\n\n")
	b.WriteString("| stack through | functions | way | first stack named | heap held | allocated | eager / lazy time |\n")
	b.WriteString("| --- | ---: | --- | ---: | ---: | ---: | ---: |\n")
	var all []int
	for i := range symbolLibs {
		all = append(all, i)
		writeSymbolRows(&b, dir, []int{i})
	}
	held := writeSymbolRows(&b, dir, all)
	fmt.Fprintf(&b, "\nTables held after the stack through all of them (`Symbolizer.Stats`): %d tables, %.2f MiB of index,\n",
		held.Tables, mib(held.IndexBytes))
	fmt.Fprintf(&b, "%.1f KiB of names, %.0f MiB of files mapped (page cache shared with the processes, not heap).\n",
		float64(held.NameBytes)/1024, mib(held.MappedBytes))
	if *symbolLibPaths == "" {
		// The same measure on the GPU machine, through torch's own libraries.
		if data, err := os.ReadFile(filepath.Join(root, "bench/symbols-h200.md")); err == nil {
			b.WriteString("\n" + string(data))
		}
	}
	return b.String()
}

// writeSymbolRows measures the stack through the libraries picked, both
// ways, and writes a row for each; it returns the lazy tables' stats.
func writeSymbolRows(b *strings.Builder, dir string, picked []int) symbolize.Stats {
	var names []string
	stack := newSymbolStack(dir, picked)
	for _, i := range picked {
		names = append(names, symbolLibs[i].name)
	}
	var lazyTimes, eagerTimes []float64
	var lazy, eager symbolCost
	var st symbolize.Stats
	for range runs {
		lazy, st = stack.nameLazily()
		eager = stack.nameEagerly()
		lazyTimes, eagerTimes = append(lazyTimes, lazy.seconds), append(eagerTimes, eager.seconds)
	}
	if !slices.Equal(lazy.names, eager.names) {
		fatalf("symbols: lazy names %q differ from eager %q", lazy.names, eager.names)
	}
	lazyT, eagerT := median(lazyTimes), median(eagerTimes)
	what := strings.Join(names, " + ")
	fmt.Fprintf(b, "| %s | %d | lazy (symbolize) | %.3f s | %.1f MiB | %.1f MiB | |\n", what, stack.functions, lazyT, mib(lazy.held), mib(lazy.allocated))
	fmt.Fprintf(b, "| %s | %d | eager (every symbol) | %.3f s | %.1f MiB | %.1f MiB | %.0fx |\n", what, stack.functions, eagerT, mib(eager.held), mib(eager.allocated), eagerT/lazyT)
	if len(picked) > 1 {
		fmt.Fprintf(b, "\nTarget: the first stack through all of them named in at most 1 s (%s: %.3f s).\n", verdict(lazyT <= 1), lazyT)
	}
	return st
}

// newSymbolStack writes a fake /proc for a process mapping the libraries
// and picks the stack's frames from each library's functions.
func newSymbolStack(dir string, picked []int) *symbolStack {
	s := &symbolStack{procRoot: filepath.Join(dir, fmt.Sprint(picked))}
	var maps strings.Builder
	for n, i := range picked {
		path, err := filepath.EvalSymlinks(symbolLibs[i].path)
		if err != nil {
			fatalf("%v: run scripts/setup.sh", err)
		}
		base := symbolsBase + uint64(n)*symbolsSpace
		s.paths, s.bases = append(s.paths, path), append(s.bases, base)
		writeMaps(&maps, path, base)
		syms := readEagerly(path)
		if len(syms) == 0 {
			fatalf("symbols: %s has no function symbols", path)
		}
		s.functions += len(syms)
		for k := range stackFrames {
			sym := syms[k*len(syms)/stackFrames]
			s.addrs = append(s.addrs, base+sym.value+sym.size/2+1)
		}
	}
	proc := filepath.Join(s.procRoot, fmt.Sprint(symbolsPID))
	check(os.MkdirAll(proc, 0o755))
	check(os.WriteFile(filepath.Join(proc, "maps"), []byte(maps.String()), 0o644))
	check(os.Symlink("/", filepath.Join(proc, "root")))
	return s
}

// writeMaps writes the maps lines of a file's executable segments mapped
// at base: ELF address v is at base+v.
func writeMaps(w *strings.Builder, path string, base uint64) {
	f, err := elf.Open(path)
	check(err)
	defer f.Close()
	var st unix.Stat_t
	check(unix.Stat(path, &st))
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			fmt.Fprintf(w, "%x-%x r-xp %08x %02x:%02x %d %s\n", base+p.Vaddr&^0xfff, base+(p.Vaddr+p.Memsz+0xfff)&^0xfff,
				p.Off&^0xfff, unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino, path)
		}
	}
}

type symbolCost struct {
	seconds         float64
	held, allocated uint64
	names           []string
}

// nameLazily names the stack with a fresh Symbolizer.
func (s *symbolStack) nameLazily() (symbolCost, symbolize.Stats) {
	var sym *symbolize.Symbolizer
	var frames []symbolize.Frame
	c := measureSymbols(func() {
		sym = symbolize.New(s.procRoot)
		frames = sym.Frames(symbolsPID, s.addrs)
	})
	st := sym.Stats()
	for _, f := range frames {
		c.names = append(c.names, f.Function)
	}
	sym.Forget(symbolsPID)
	return c, st
}

// nameEagerly names the stack the old way: every symbol of each library
// read and demangled, then the frames looked up.
func (s *symbolStack) nameEagerly() symbolCost {
	var tables [][]eagerSymbol
	var names []string
	c := measureSymbols(func() {
		tables = tables[:0]
		for _, p := range s.paths {
			tables = append(tables, readEagerly(p))
		}
		for _, addr := range s.addrs {
			n := sort.Search(len(s.bases), func(n int) bool { return s.bases[n] > addr-1 }) - 1
			names = append(names, eagerLookup(tables[n], addr-1-s.bases[n]))
		}
	})
	runtime.KeepAlive(tables)
	c.names = names
	return c
}

// measureSymbols times f and reads the heap it left live and allocated.
func measureSymbols(f func()) symbolCost {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	f()
	elapsed := time.Since(start).Seconds()
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	runtime.GC()
	runtime.ReadMemStats(&after)
	return symbolCost{seconds: elapsed, held: after.HeapAlloc - min(after.HeapAlloc, before.HeapAlloc), allocated: allocated}
}

// eagerSymbol and readEagerly are the symbolizer as it was: every function
// symbol a Go string, demangled up front. Kept here only to compare.
type eagerSymbol struct {
	value, size uint64
	name        string
}

func readEagerly(path string) []eagerSymbol {
	f, err := elf.Open(path)
	check(err)
	defer f.Close()
	var syms []eagerSymbol
	seen := map[uint64]bool{}
	for _, read := range []func() ([]elf.Symbol, error){f.Symbols, f.DynamicSymbols} {
		all, _ := read() // stripped files have no .symtab
		for _, sym := range all {
			if elf.ST_TYPE(sym.Info) == elf.STT_FUNC && sym.Value != 0 && !seen[sym.Value] {
				seen[sym.Value] = true
				syms = append(syms, eagerSymbol{sym.Value, sym.Size, demangle.Filter(sym.Name, demangle.NoParams)})
			}
		}
	}
	sort.Slice(syms, func(i, j int) bool { return syms[i].value < syms[j].value })
	return syms
}

func eagerLookup(syms []eagerSymbol, vaddr uint64) string {
	i := sort.Search(len(syms), func(i int) bool { return syms[i].value > vaddr }) - 1
	if i < 0 || (syms[i].size != 0 && vaddr >= syms[i].value+syms[i].size) {
		return ""
	}
	return syms[i].name
}

func mib[T int64 | uint64](n T) float64 { return float64(n) / (1 << 20) }
