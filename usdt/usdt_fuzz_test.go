package usdt

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/internal/fuzzseed"
)

// probesLibrary has torch 2.11's probes (pytorch:malloc with a register, a
// byte register, a frame slot; pytorch:free) behind semaphores in
// .probes, and a probe with a constant.
const probesLibrary = `
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#include <stdint.h>
unsigned short pytorch_malloc_semaphore __attribute__((section(".probes"))) __attribute__((used));
unsigned short pytorch_free_semaphore __attribute__((section(".probes"))) __attribute__((used));
unsigned short gpumem_constant_semaphore __attribute__((section(".probes"))) __attribute__((used));
void *simalloc(int8_t device, unsigned long size, void *stream) {
	void *p = (void *)(size * 3);
	volatile long slot = (long)stream;
	if (pytorch_malloc_semaphore) STAP_PROBE4(pytorch, malloc, p, device, size, slot);
	return p;
}
void simfree(void *p) {
	if (pytorch_free_semaphore) STAP_PROBE1(pytorch, free, p);
	STAP_PROBE1(gpumem, constant, 42);
}
`

// realNotes are the .note.stapsdt sections of files on every machine of
// this kind: CPython 3.11's (22 probes) and libstdc++'s.
var realNotes = map[string]string{
	"python3.11": "/usr/bin/python3.11",
	"libstdc++":  "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
}

func TestWriteUSDTSeeds(t *testing.T) {
	if os.Getenv("GPUMEM_WRITE_SEEDS") != "1" {
		t.Skip("GPUMEM_WRITE_SEEDS=1 writes the seed corpora")
	}
	dir := t.TempDir()
	src, lib := filepath.Join(dir, "probes.c"), filepath.Join(dir, "libprobes.so")
	if err := os.WriteFile(src, []byte(probesLibrary), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cc", "-O1", "-shared", "-fPIC", "-s", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	small, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"libprobes.so": lib}
	for name, path := range realNotes {
		files[name] = path
	}
	var notes []fuzzseed.Seed
	specs := map[string]bool{}
	for name, path := range files {
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		data, err := f.Section(".note.stapsdt").Data()
		if err != nil {
			t.Fatal(err)
		}
		notes = append(notes, fuzzseed.Of(name, data, uint64(0)))
		if base := f.Section(".stapsdt.base"); base != nil {
			notes = append(notes, fuzzseed.Of(name+"-prelinked", data, base.Addr+0x1000))
		}
		probes, err := readFile(f)
		f.Close()
		if err != nil || len(probes) == 0 {
			t.Fatalf("%s: %d probes, %v", path, len(probes), err)
		}
		for _, s := range noteArgStrings(data) {
			for _, spec := range strings.Fields(s) {
				specs[spec] = true
			}
		}
	}
	fuzzseed.Write(t, "FuzzNotes", notes)
	fuzzseed.Write(t, "FuzzRead", []fuzzseed.Seed{
		fuzzseed.Of("libprobes.so", small),
		fuzzseed.Of("libprobes.so-headers", small[:64]),
		fuzzseed.Of("libprobes.so-half", small[:len(small)/2]),
	})
	// The operands of torch 2.11's libc10_cuda.so (usdt_test.go) and of
	// the files above.
	for _, spec := range []string{"8@%rax", "1@%dl", "-1@%dl", "8@%r14", "8@-56(%rbp)", "8@%rdi", "8@(%r12)", "-4@%r8d", "2@0x10(%rsp)", "-8@$-3", "8@-8(%rbp,%rax,8)"} {
		specs[spec] = true
	}
	var args []fuzzseed.Seed
	for _, spec := range slices.Sorted(func(yield func(string) bool) {
		for s := range specs {
			if !yield(s) {
				return
			}
		}
	}) {
		args = append(args, fuzzseed.Of(fmt.Sprintf("arg-%02d", len(args)), spec))
	}
	fuzzseed.Write(t, "FuzzParseArg", args)
}

// noteArgStrings are the argument strings of a section's stapsdt notes.
func noteArgStrings(data []byte) []string {
	var out []string
	for len(data) > 0 {
		desc, typ, rest, err := nextNote(data)
		if err != nil {
			break
		}
		data = rest
		if typ == stapsdt && len(desc) > 24 {
			if strs := bytes.SplitN(desc[24:], []byte{0}, 4); len(strs) >= 3 {
				out = append(out, string(strs[2]))
			}
		}
	}
	return out
}

// checkArg: an argument parsed is one the BPF program can read.
func checkArg(t *testing.T, spec string, a Arg) {
	t.Helper()
	if a.Size != 1 && a.Size != 2 && a.Size != 4 && a.Size != 8 {
		t.Fatalf("%q: size %d", spec, a.Size)
	}
	switch a.Kind {
	case ArgRegister, ArgMemory:
		if !slices.Contains(slices.Collect(func(yield func(uint16) bool) {
			for _, off := range ptRegs {
				if !yield(off) {
					return
				}
			}
		}), a.Reg) {
			t.Fatalf("%q: register at %d in pt_regs", spec, a.Reg)
		}
	case ArgConstant:
	default:
		t.Fatalf("%q: kind %d", spec, a.Kind)
	}
}

// FuzzParseArg: any operand parses to an argument the BPF program can
// read, or is refused.
func FuzzParseArg(f *testing.F) {
	f.Fuzz(func(t *testing.T, spec string) {
		if a, err := ParseArg(spec); err == nil {
			checkArg(t, spec, a)
		}
	})
}

// fuzzLoads are where fuzzed notes' addresses land: a library's text and
// data, and a segment with no bytes in the file (.bss).
var fuzzLoads = []elf.ProgHeader{
	{Type: elf.PT_LOAD, Vaddr: 0, Off: 0, Filesz: 0x20000, Memsz: 0x20000},
	{Type: elf.PT_LOAD, Vaddr: 0x221000, Off: 0x21000, Filesz: 0x3000, Memsz: 0x3000},
	{Type: elf.PT_LOAD, Vaddr: 0x8cc000, Off: 0x4cc000, Filesz: 0x200000, Memsz: 0x280000},
	{Type: elf.PT_LOAD, Vaddr: 0xffffffffffff0000, Off: 0x1000, Filesz: 0, Memsz: 0x20000},
}

// FuzzNotes: any .note.stapsdt section parses to probes at offsets in
// the file, with readable arguments, or is refused.
func FuzzNotes(f *testing.F) {
	f.Fuzz(func(t *testing.T, notes []byte, shift uint64) {
		probes, err := parseNotes(notes, fuzzLoads, shift)
		if err != nil {
			return
		}
		if len(probes) > len(notes)/24 {
			t.Fatalf("%d probes from %d bytes", len(probes), len(notes))
		}
		for _, p := range probes {
			checkProbe(t, p, fuzzLoads)
		}
	})
}

func checkProbe(t *testing.T, p Probe, loads []elf.ProgHeader) {
	t.Helper()
	inFile := func(off uint64) bool {
		return slices.ContainsFunc(loads, func(l elf.ProgHeader) bool { return off >= l.Off && off-l.Off < l.Filesz })
	}
	if !inFile(p.Offset) || p.SemaphoreOffset != 0 && !inFile(p.SemaphoreOffset) {
		t.Fatalf("probe %s:%s at %#x, semaphore %#x: not in the file's loaded bytes", p.Provider, p.Name, p.Offset, p.SemaphoreOffset)
	}
	for _, a := range p.Args {
		checkArg(t, fmt.Sprintf("%s:%s", p.Provider, p.Name), a)
	}
}

// FuzzRead: any file read as an ELF file gives probes or an error.
func FuzzRead(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		ef, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return
		}
		probes, err := readFile(ef)
		if err != nil {
			return
		}
		var loads []elf.ProgHeader
		for _, p := range ef.Progs {
			if p.Type == elf.PT_LOAD {
				loads = append(loads, p.ProgHeader)
			}
		}
		for _, p := range probes {
			checkProbe(t, p, loads)
		}
	})
}
