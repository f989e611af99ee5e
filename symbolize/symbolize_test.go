package symbolize

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A C++ program that prints a function's address and its own pid, then
// waits: a real process to symbolize through /proc, with a mangled name.
const program = `
#include <cstdio>
#include <unistd.h>
namespace model {
struct Runner {
	__attribute__((noinline)) static void allocate_kv_cache(int) { std::puts("x"); }
};
}
int main() {
	std::printf("%d %lx\n", getpid(), (unsigned long)&model::Runner::allocate_kv_cache);
	std::fflush(stdout);
	getchar();
}
`

func startProgram(t *testing.T) (pid int, addr uint64, stop func()) {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "prog.cc")
	if err := os.WriteFile(src, []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "prog")
	if out, err := exec.Command("c++", "-O1", "-fPIE", "-pie", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("c++: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop = func() { stdin.Close(); cmd.Wait() }
	t.Cleanup(stop)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(line)
	pid, _ = strconv.Atoi(fields[0])
	addr, _ = strconv.ParseUint(fields[1], 16, 64)
	return pid, addr, stop
}

func TestFramesOfARunningProcess(t *testing.T) {
	pid, addr, stop := startProgram(t)
	s := New("/proc")
	// Frames looks each return address up one byte back: pass addr+1 so the
	// lookup lands on the function's first byte.
	frames := s.Frames(uint32(pid), []uint64{addr + 1, 0x10, addr + 1})
	if got := frames[0].Function; got != "model::Runner::allocate_kv_cache" {
		t.Errorf("function %q, want the demangled name without parameters", got)
	}
	if filepath.Base(frames[0].Module) != "prog" {
		t.Errorf("module %q", frames[0].Module)
	}
	// A position-independent executable: the frame's address is the ELF
	// address, the same in every process, not the randomized runtime one.
	if frames[0].Address >= 0x100000 {
		t.Errorf("address %#x is not an ELF address", frames[0].Address)
	}
	// 0x10 is in no executable mapping: the chain ends there.
	if len(frames) != 1 {
		t.Errorf("frames after an impossible return address: %+v", frames)
	}

	// After the process is gone, its cached mappings still resolve.
	stop()
	again := s.Frames(uint32(pid), []uint64{addr + 1})
	if again[0] != frames[0] {
		t.Errorf("%+v != %+v", again[0], frames[0])
	}
}

func TestUnreadableProcessKeepsAddresses(t *testing.T) {
	frames := New("/proc").Frames(1<<30, []uint64{0x1001, 0x2001})
	if len(frames) != 2 || frames[0].Name() != "[unknown]+0x1000" {
		t.Errorf("%+v", frames)
	}
}

func TestUnresolvedFrameKeepsModuleAndOffset(t *testing.T) {
	f := Frame{Module: "/usr/lib/libcuda.so.1", Address: 0x1234}
	if got := f.Name(); got != "libcuda.so.1+0x1234" {
		t.Errorf("%q", got)
	}
	named := Frame{Function: "c10::cuda::CUDACachingAllocator::malloc", Module: "/x/libc10_cuda.so"}
	if got := named.Name(); got != named.Function {
		t.Errorf("%q", got)
	}
}

func TestLookupStaysInsideSymbols(t *testing.T) {
	x := index{{addr: 0x100, size: 0x10}, {addr: 0x200}}
	names := []string{"f", "sizeless"}
	for addr, want := range map[uint64]string{0xff: "", 0x100: "f", 0x10f: "f", 0x110: "", 0x250: "sizeless"} {
		got := ""
		if i, ok := x.find(addr); ok {
			got = names[i]
		}
		if got != want {
			t.Errorf("%#x: %q, want %q", addr, got, want)
		}
	}
}

// A stack's address outside every cached mapping has the maps read again
// only if they were read before the stack was taken: a library loaded
// since (dlopen) may hold it. Maps read after it hold every library it
// could be in, so that a chain ending in a stray address reads nothing.
func TestMapsReadAgainOnlyForStacksTakenAfter(t *testing.T) {
	lib, loaded, segs, syms := twoCopies(t)
	inLib, inLoaded := base+syms[0].value+1, base+1<<32+syms[0].value+1
	root := t.TempDir()
	fakeProcess(t, root, 1, map[string]uint64{lib: base}, segs)
	s := New(root)
	taken := time.Now()
	if got := s.FramesTaken(1, []uint64{inLib}, taken); len(got) != 1 || got[0].Function != syms[0].name {
		t.Fatalf("first read: %+v, want %s", got, syms[0].name)
	}

	fakeProcess(t, root, 1, map[string]uint64{lib: base, loaded: base + 1<<32}, segs) // loaded after taken
	if got := s.FramesTaken(1, []uint64{inLib, inLoaded}, taken); len(got) != 1 {
		t.Errorf("a stack taken before the maps were read read them again: %+v", got)
	}
	got := s.FramesTaken(1, []uint64{inLib, inLoaded}, time.Now())
	if len(got) != 2 || got[1].Function != syms[0].name || got[1].Module != loaded {
		t.Errorf("a stack taken after the library was loaded: %+v, want %s in %s", got, syms[0].name, loaded)
	}
}
