// Package usdt reads the USDT probes (SystemTap SDT notes, .note.stapsdt)
// of an ELF file: where each probe is, its semaphore, and where its
// arguments live at the probe (x86-64 assembler operands such as 8@%rax,
// -4@-20(%rbp), 8@$42), so that a uprobe there can read them.
package usdt

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Probe is one probe site; a probe may have several.
type Probe struct {
	Provider, Name string
	// Offset is the site's offset in the file (what a uprobe takes);
	// SemaphoreOffset the semaphore's, or 0 for a probe without one.
	Offset, SemaphoreOffset uint64
	Args                    []Arg
}

// ArgKind says where an argument is.
type ArgKind uint8

const (
	ArgRegister ArgKind = iota + 1 // in register Reg
	ArgMemory                      // at Reg's value plus Value, in the process's memory
	ArgConstant                    // Value itself
)

// Arg is where one argument is at the probe.
type Arg struct {
	Kind   ArgKind
	Reg    uint16 // offset of the register in the kernel's struct pt_regs
	Value  int64  // offset from the register (memory) or the constant
	Size   uint8  // bytes: 1, 2, 4 or 8
	Signed bool
}

// stapsdt is the note type of SDT probe descriptors.
const stapsdt = 3

// maxNotes bounds the SDT notes read from one file. Real ones take a few
// kilobytes (CPython's 3.11 has 22 probes in 2 KiB); the file is untrusted,
// and a compressed section may claim any size once inflated.
const maxNotes = 1 << 20

// Read returns the probes of the file at path, in note order. A file
// without SDT notes has none; a note that cannot be parsed is an error.
func Read(path string) ([]Probe, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	probes, err := readFile(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return probes, nil
}

// readFile is Read of an opened file.
func readFile(f *elf.File) ([]Probe, error) {
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 {
		return nil, errors.New("USDT arguments are read for x86-64 only")
	}
	notes := f.Section(".note.stapsdt")
	if notes == nil {
		return nil, nil
	}
	if notes.Size > maxNotes {
		return nil, fmt.Errorf(".note.stapsdt: %d bytes, more than %d", notes.Size, maxNotes)
	}
	data, err := notes.Data()
	if err != nil {
		return nil, fmt.Errorf("read .note.stapsdt: %w", err)
	}
	// Addresses in notes are relative to .stapsdt.base as linked; the
	// section's address now says by how much a prelinker moved them.
	var shift uint64
	if base := f.Section(".stapsdt.base"); base != nil {
		shift = base.Addr
	}
	var loads []elf.ProgHeader
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			loads = append(loads, p.ProgHeader)
		}
	}
	return parseNotes(data, loads, shift)
}

// parseNotes reads the probes of a .note.stapsdt section, in a file whose
// loadable segments are loads and whose .stapsdt.base is at shift.
func parseNotes(data []byte, loads []elf.ProgHeader, shift uint64) ([]Probe, error) {
	var probes []Probe
	for len(data) > 0 {
		desc, typ, rest, err := nextNote(data)
		if err != nil {
			return nil, err
		}
		data = rest
		if typ != stapsdt {
			continue
		}
		p, err := parseProbe(loads, desc, shift)
		if err != nil {
			return nil, err
		}
		probes = append(probes, p)
	}
	return probes, nil
}

// nextNote splits off one ELF note: its descriptor and type. Sizes are
// taken in 64 bits: a size near 4 GiB must not wrap around to a small one.
func nextNote(data []byte) (desc []byte, typ uint32, rest []byte, err error) {
	if len(data) < 12 {
		return nil, 0, nil, errors.New("truncated note header")
	}
	namesz, descsz := uint64(binary.LittleEndian.Uint32(data)), uint64(binary.LittleEndian.Uint32(data[4:]))
	typ = binary.LittleEndian.Uint32(data[8:])
	descAt := 12 + align4(namesz)
	end := descAt + align4(descsz)
	if end > uint64(len(data)) {
		return nil, 0, nil, errors.New("truncated note")
	}
	return data[descAt : descAt+descsz], typ, data[end:], nil
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }

// parseProbe reads a stapsdt descriptor: the site's address, the base's,
// the semaphore's, then provider, name and arguments as C strings.
func parseProbe(loads []elf.ProgHeader, desc []byte, base uint64) (Probe, error) {
	if len(desc) < 24 {
		return Probe{}, errors.New("truncated stapsdt note")
	}
	pc, linkedBase, sem := binary.LittleEndian.Uint64(desc), binary.LittleEndian.Uint64(desc[8:]), binary.LittleEndian.Uint64(desc[16:])
	strs := bytes.SplitN(desc[24:], []byte{0}, 4)
	if len(strs) < 3 {
		return Probe{}, errors.New("stapsdt note without provider, name and arguments")
	}
	p := Probe{Provider: string(strs[0]), Name: string(strs[1])}
	if base != 0 {
		pc += base - linkedBase
		if sem != 0 {
			sem += base - linkedBase
		}
	}
	var err error
	if p.Offset, err = fileOffset(loads, pc); err != nil {
		return p, fmt.Errorf("probe %s:%s: %w", p.Provider, p.Name, err)
	}
	if sem != 0 {
		if p.SemaphoreOffset, err = fileOffset(loads, sem); err != nil {
			return p, fmt.Errorf("probe %s:%s semaphore: %w", p.Provider, p.Name, err)
		}
	}
	for _, spec := range strings.Fields(string(strs[2])) {
		a, err := ParseArg(spec)
		if err != nil {
			return p, fmt.Errorf("probe %s:%s: %w", p.Provider, p.Name, err)
		}
		p.Args = append(p.Args, a)
	}
	return p, nil
}

// fileOffset converts a virtual address to its offset in the file, through
// the loadable segment whose bytes in the file hold it.
func fileOffset(loads []elf.ProgHeader, addr uint64) (uint64, error) {
	for _, prog := range loads {
		if addr >= prog.Vaddr && addr-prog.Vaddr < prog.Filesz {
			return addr - prog.Vaddr + prog.Off, nil
		}
	}
	return 0, fmt.Errorf("address %#x is in no loadable segment", addr)
}

// ParseArg parses one argument operand: SIZE@OPERAND, SIZE negative for a
// signed value; OPERAND %reg, $constant, (%reg) or offset(%reg).
func ParseArg(spec string) (Arg, error) {
	sizeText, operand, ok := strings.Cut(spec, "@")
	if !ok {
		return Arg{}, fmt.Errorf("argument %q: no size", spec)
	}
	size, err := strconv.Atoi(sizeText)
	if err != nil {
		return Arg{}, fmt.Errorf("argument %q: size: %w", spec, err)
	}
	a := Arg{Signed: size < 0}
	if size < 0 {
		size = -size
	}
	if size != 1 && size != 2 && size != 4 && size != 8 {
		return Arg{}, fmt.Errorf("argument %q: size %d", spec, size)
	}
	a.Size = uint8(size)
	switch {
	case strings.HasPrefix(operand, "$"):
		a.Kind = ArgConstant
		a.Value, err = strconv.ParseInt(operand[1:], 0, 64)
	case strings.HasPrefix(operand, "%"):
		a.Kind = ArgRegister
		a.Reg, err = register(operand[1:])
	case strings.HasSuffix(operand, ")"):
		a.Kind = ArgMemory
		offset, reg, _ := strings.Cut(strings.TrimSuffix(operand, ")"), "(")
		if offset != "" {
			if a.Value, err = strconv.ParseInt(offset, 0, 64); err != nil {
				break
			}
		}
		if !strings.HasPrefix(reg, "%") {
			err = errors.New("not a register")
			break
		}
		a.Reg, err = register(reg[1:])
	default:
		err = errors.New("unknown operand")
	}
	if err != nil {
		return Arg{}, fmt.Errorf("argument %q: %w", spec, err)
	}
	return a, nil
}

// ptRegs are the offsets of the x86-64 kernel's struct pt_regs.
var ptRegs = map[string]uint16{
	"r15": 0, "r14": 8, "r13": 16, "r12": 24, "rbp": 32, "rbx": 40, "r11": 48, "r10": 56,
	"r9": 64, "r8": 72, "rax": 80, "rcx": 88, "rdx": 96, "rsi": 104, "rdi": 112, "rip": 128, "rsp": 152,
}

// aliases are the narrower names of the registers: the value is read from
// the full register and cut to the argument's size.
var aliases = map[string]string{
	"eax": "rax", "ax": "rax", "al": "rax", "ebx": "rbx", "bx": "rbx", "bl": "rbx",
	"ecx": "rcx", "cx": "rcx", "cl": "rcx", "edx": "rdx", "dx": "rdx", "dl": "rdx",
	"esi": "rsi", "si": "rsi", "sil": "rsi", "edi": "rdi", "di": "rdi", "dil": "rdi",
	"ebp": "rbp", "bp": "rbp", "bpl": "rbp", "esp": "rsp", "sp": "rsp", "spl": "rsp",
}

func register(name string) (uint16, error) {
	if full, ok := aliases[name]; ok {
		name = full
	}
	// r8d, r8w, r8b are r8's low 32, 16 and 8 bits.
	if len(name) > 2 && name[0] == 'r' && strings.ContainsAny(name[len(name)-1:], "dwb") {
		if _, ok := ptRegs[name[:len(name)-1]]; ok {
			name = name[:len(name)-1]
		}
	}
	off, ok := ptRegs[name]
	if !ok {
		return 0, fmt.Errorf("unknown register %q", name)
	}
	return off, nil
}
