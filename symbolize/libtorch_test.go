package symbolize

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Every 97th function of libtorch_cpu, at its first byte, in its middle and
// just past its end, named lazily: the names an eager read of every symbol
// gives, and only the symbols hit cost a name.
func TestLibtorchNamesMatchAnEagerRead(t *testing.T) {
	requireFile(t, libtorch)
	syms := readEager(t, libtorch)
	if len(syms) < 20000 {
		t.Fatalf("%d function symbols in %s, want libtorch's 22k", len(syms), libtorch)
	}
	segs := execSegments(t, libtorch)
	root := t.TempDir()
	fakeProcess(t, root, 100, map[string]uint64{libtorch: base}, map[string][]elf.ProgHeader{libtorch: segs})
	inText := func(vaddr uint64) bool {
		for _, p := range segs {
			if p.Vaddr <= vaddr && vaddr < p.Vaddr+p.Filesz {
				return true
			}
		}
		return false
	}
	var vaddrs []uint64
	for i := 0; i < len(syms); i += 97 {
		for _, v := range []uint64{syms[i].value, syms[i].value + syms[i].size/2, syms[i].value + syms[i].size} {
			if inText(v) {
				vaddrs = append(vaddrs, v)
			}
		}
	}

	s := New(root)
	hit := map[int]bool{}
	named := 0
	const stackDepth = 64
	for start := 0; start < len(vaddrs); start += stackDepth {
		stack := vaddrs[start:min(start+stackDepth, len(vaddrs))]
		addrs := make([]uint64, len(stack))
		for i, v := range stack {
			addrs[i] = base + v + 1
		}
		frames := s.Frames(100, addrs)
		if len(frames) != len(stack) {
			t.Fatalf("%d frames for %d addresses", len(frames), len(stack))
		}
		for i, f := range frames {
			want, at := eagerLookup(syms, stack[i])
			if f.Function != want || f.Address != stack[i] {
				t.Errorf("%#x: %q at %#x, want %q", stack[i], f.Function, f.Address, want)
			}
			if at >= 0 {
				hit[at] = true
			}
			if want != "" {
				named++
			}
		}
	}
	if named < len(vaddrs)/2 {
		t.Errorf("only %d of %d addresses named", named, len(vaddrs))
	}
	st, _ := os.Stat(libtorch)
	want := Stats{Tables: 1, IndexBytes: int64(len(syms)) * entryBytes, NameBytes: cachedNameBytes(syms, hit), MappedBytes: st.Size()}
	if got := s.Stats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	t.Logf("%d addresses, %d symbols hit of %d: %+v", len(vaddrs), len(hit), len(syms), want)
	s.Forget(100)
	if got := s.Stats(); got != (Stats{}) {
		t.Errorf("after Forget: %+v", got)
	}
}

// dlopener loads a library and prints its pid and a function's address,
// then waits on stdin: a real process mapping the library.
const dlopener = `
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
	void *lib = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
	if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
	void *fn = dlsym(lib, argv[2]);
	if (!fn) { fprintf(stderr, "%s\n", dlerror()); return 1; }
	printf("%d %lx\n", getpid(), (unsigned long)fn);
	fflush(stdout);
	getchar();
	return 0;
}
`

// Eight processes with libtorch loaded: its table is held once, and goes
// with the last of them.
func TestEightProcessesShareLibtorch(t *testing.T) {
	requireFile(t, libtorch)
	dir := t.TempDir()
	src := filepath.Join(dir, "dlopener.c")
	if err := os.WriteFile(src, []byte(dlopener), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "dlopener")
	if out, err := exec.Command("cc", "-O1", "-o", bin, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	symbol, name := exportedFunction(t, libtorch)
	real, err := filepath.EvalSymlinks(libtorch) // what /proc/PID/maps says
	if err != nil {
		t.Fatal(err)
	}

	var cmds []*exec.Cmd
	var outs []*bufio.Reader
	for range 8 {
		cmd := exec.Command(bin, libtorch, symbol)
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close(); cmd.Wait() })
		cmds = append(cmds, cmd)
		outs = append(outs, bufio.NewReader(stdout))
	}
	s := New("/proc")
	var pids []uint32
	for _, out := range outs {
		line, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("dlopener: %v", err)
		}
		fields := strings.Fields(line)
		pid, _ := strconv.Atoi(fields[0])
		addr, _ := strconv.ParseUint(fields[1], 16, 64)
		s.Track(uint32(pid))
		frames := s.Frames(uint32(pid), []uint64{addr + 1})
		if frames[0].Function != name || frames[0].Module != real {
			t.Errorf("pid %d: %q in %s, want %q in %s", pid, frames[0].Function, frames[0].Module, name, real)
		}
		pids = append(pids, uint32(pid))
	}
	st, _ := os.Stat(libtorch)
	if got := s.Stats(); got.Tables != 1 || got.MappedBytes != st.Size() {
		t.Errorf("stats %+v, want one table of %d bytes mapped", got, st.Size())
	}
	for i, pid := range pids {
		s.Forget(pid)
		want := 1
		if i == len(pids)-1 {
			want = 0
		}
		if got := s.Stats().Tables; got != want {
			t.Errorf("after forgetting %d of 8: %d tables, want %d", i+1, got, want)
		}
	}
	if got := s.Stats(); got != (Stats{}) {
		t.Errorf("after forgetting all 8: %+v", got)
	}
}

// exportedFunction is a C++ function libtorch exports (dlsym finds it),
// alone at its address, and its name as the eager read gives it.
func exportedFunction(t *testing.T, path string) (symbol, name string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dyn, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	perAddr := map[uint64]int{}
	for _, sym := range dyn {
		perAddr[sym.Value]++
	}
	syms := readEager(t, path)
	for _, sym := range dyn {
		if elf.ST_TYPE(sym.Info) == elf.STT_FUNC && elf.ST_BIND(sym.Info) == elf.STB_GLOBAL && sym.Section != elf.SHN_UNDEF &&
			strings.HasPrefix(sym.Name, "_ZN2at6native") && perAddr[sym.Value] == 1 {
			if name, _ := eagerLookup(syms, sym.Value); name != "" && !strings.HasPrefix(name, "_Z") {
				return sym.Name, name
			}
		}
	}
	t.Fatalf("no exported at::native function in %s", path)
	return "", ""
}
