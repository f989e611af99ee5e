package usdt

import (
	"bytes"
	"debug/elf"
	"fmt"
	"slices"
	"testing"
)

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
