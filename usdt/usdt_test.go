package usdt

import (
	"debug/elf"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestParseArg(t *testing.T) {
	// The operands of torch 2.11's libc10_cuda.so (pytorch:malloc and
	// pytorch:free), and the other forms compilers write.
	for spec, want := range map[string]Arg{
		"8@%rax":       {Kind: ArgRegister, Reg: 80, Size: 8},
		"1@%dl":        {Kind: ArgRegister, Reg: 96, Size: 1},
		"-1@%dl":       {Kind: ArgRegister, Reg: 96, Size: 1, Signed: true},
		"8@%r14":       {Kind: ArgRegister, Reg: 8, Size: 8},
		"8@-56(%rbp)":  {Kind: ArgMemory, Reg: 32, Value: -56, Size: 8},
		"8@%rdi":       {Kind: ArgRegister, Reg: 112, Size: 8},
		"8@(%r12)":     {Kind: ArgMemory, Reg: 24, Size: 8},
		"-4@%r8d":      {Kind: ArgRegister, Reg: 72, Size: 4, Signed: true},
		"2@0x10(%rsp)": {Kind: ArgMemory, Reg: 152, Value: 16, Size: 2},
		"-8@$-3":       {Kind: ArgConstant, Value: -3, Size: 8, Signed: true},
	} {
		got, err := ParseArg(spec)
		if err != nil || got != want {
			t.Errorf("%s: got %+v, %v; want %+v", spec, got, err, want)
		}
	}
	for _, bad := range []string{"8%rax", "3@%rax", "8@%xmm0", "8@-8(%rbp,%rax,8)", "8@rax"} {
		if a, err := ParseArg(bad); err == nil {
			t.Errorf("%s: parsed as %+v", bad, a)
		}
	}
}

// TestSimulatedAllocator reads the probes of the simulated libc10_cuda.so,
// built into a folder of the test's (not the tree's build/): the two
// probes, their arguments, and semaphores at the file offsets of the
// semaphore symbols.
func TestSimulatedAllocator(t *testing.T) {
	root, _ := filepath.Abs("..")
	dir := t.TempDir()
	lib := filepath.Join(dir, "libc10_cuda.so")
	if out, err := exec.Command("make", "-s", "-C", root, "SIM="+dir, lib).CombinedOutput(); err != nil {
		t.Fatalf("make %s: %v\n%s", lib, err, out)
	}
	probes, err := Read(lib)
	if err != nil {
		t.Fatal(err)
	}
	semaphores := symbolOffsets(t, lib, "pytorch_malloc_semaphore", "pytorch_free_semaphore")
	args := map[string]int{"malloc": 4, "free": 1}
	for _, p := range probes {
		if p.Provider != "pytorch" || args[p.Name] == 0 {
			t.Errorf("unexpected probe %s:%s", p.Provider, p.Name)
			continue
		}
		if len(p.Args) != args[p.Name] {
			t.Errorf("%s: %d arguments, want %d", p.Name, len(p.Args), args[p.Name])
		}
		if p.SemaphoreOffset != semaphores["pytorch_"+p.Name+"_semaphore"] || p.SemaphoreOffset == 0 {
			t.Errorf("%s: semaphore at %#x, symbol at %#x", p.Name, p.SemaphoreOffset, semaphores["pytorch_"+p.Name+"_semaphore"])
		}
		if p.Offset == 0 {
			t.Errorf("%s: no location", p.Name)
		}
		delete(args, p.Name)
	}
	if len(args) != 0 {
		t.Errorf("probes missing: %v", args)
	}
	// The device is a signed byte, as in torch.
	for _, p := range probes {
		if p.Name == "malloc" && (p.Args[1].Size != 1 || !p.Args[1].Signed) {
			t.Errorf("malloc's device argument: %+v", p.Args[1])
		}
	}
}

func symbolOffsets(t *testing.T, path string, names ...string) map[string]uint64 {
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, s := range syms {
		for _, n := range names {
			if s.Name == n {
				sec := f.Sections[s.Section]
				out[n] = s.Value - sec.Addr + sec.Offset
			}
		}
	}
	return out
}
