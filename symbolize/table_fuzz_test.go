package symbolize

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"testing"
)

// The fuzz targets call parseELF and the table's lookups directly, not
// through guard: guard turns a panic into a lost file, which is right for
// the agent and would hide the bug from the fuzzer.

// maxFuzzEntries is the index bound the targets run tables with.
const maxFuzzEntries = 1 << 16

// fuzzTable is a table of a mapped file's bytes, as openTable makes one.
func fuzzTable(data []byte, e *elfFile, maxEntries int) *table {
	return &table{data: data, elf: e, maxEntries: maxEntries}
}

// lookup names vaddr as table.name does, without the fault guard.
func (t *table) lookup(vaddr uint64) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nameLocked(vaddr)
}

// checkTable: the index is bounded, sorted and has one entry per address;
// every indexed function is named, and no name is longer than what the
// file holds or the demangler's bound.
func checkTable(t *testing.T, tb *table, data []byte) {
	t.Helper()
	tb.lookup(0)
	x := tb.index
	if len(x) > tb.maxEntries || int64(len(x))*entryBytes > int64(len(data)) {
		t.Fatalf("%d index entries from a %d-byte file (bound %d)", len(x), len(data), tb.maxEntries)
	}
	for i := 1; i < len(x); i++ {
		if x[i-1].addr >= x[i].addr {
			t.Fatalf("index not sorted by address at %d: %#x then %#x", i, x[i-1].addr, x[i].addr)
		}
	}
	for i, e := range x {
		if i == 64 {
			break
		}
		name := tb.lookup(e.addr)
		if len(name) > maxNameBytes && len(name) > len(data) {
			t.Fatalf("a %d-byte name from a %d-byte file", len(name), len(data))
		}
	}
}

// FuzzParseELF: any file mapped as a library gives a table or an error,
// and its names are read without panic and with bounded memory.
func FuzzParseELF(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := parseELF(data)
		if err != nil {
			return
		}
		if len(e.buildID) > maxBuildID {
			t.Fatalf("a %d-byte build ID", len(e.buildID))
		}
		tb := fuzzTable(data, e, maxFuzzEntries)
		for _, off := range []uint64{0, 0x1000, uint64(len(data)) / 2, uint64(len(data)) - 1} {
			if vaddr, ok := tb.fileOffsetToVaddr(off); ok {
				tb.lookup(vaddr)
			}
		}
		checkTable(t, tb, data)
	})
}

// synthELF is a little-endian x86-64 (or, with elf32, i386) shared library
// holding the given .symtab and .dynsym entries and their string tables,
// all in one loadable segment: the fuzzer works on the tables themselves.
func synthELF(symtab, strtab, dynsym, dynstr []byte, elf32 bool) []byte {
	const shstrtab = "\x00.symtab\x00.strtab\x00.dynsym\x00.dynstr\x00.shstrtab\x00"
	ehsize, phsize, shsize := 64, 56, 64
	if elf32 {
		ehsize, phsize, shsize = 52, 32, 40
	}
	var body bytes.Buffer
	body.Write(make([]byte, ehsize+phsize))
	type sec struct {
		name, typ, link int
		off, size       int
		entsize         int
	}
	entsize := sym64Size
	if elf32 {
		entsize = sym32Size
	}
	var secs []sec
	add := func(name, typ, link int, data []byte, ent int) {
		for body.Len()%8 != 0 {
			body.WriteByte(0)
		}
		secs = append(secs, sec{name, typ, link, body.Len(), len(data), ent})
		body.Write(data)
	}
	add(1, int(elf.SHT_SYMTAB), 2, symtab, entsize)
	add(9, int(elf.SHT_STRTAB), 0, strtab, 0)
	add(17, int(elf.SHT_DYNSYM), 4, dynsym, entsize)
	add(25, int(elf.SHT_STRTAB), 0, dynstr, 0)
	add(33, int(elf.SHT_STRTAB), 0, []byte(shstrtab), 0)
	for body.Len()%8 != 0 {
		body.WriteByte(0)
	}
	shoff := body.Len()
	le := binary.LittleEndian
	out := body.Bytes()
	if elf32 {
		for _, s := range append([]sec{{}}, secs...) {
			out, _ = binary.Append(out, le, elf.Section32{Name: uint32(s.name), Type: uint32(s.typ), Link: uint32(s.link),
				Off: uint32(s.off), Size: uint32(s.size), Entsize: uint32(s.entsize), Addralign: 1})
		}
		hdr := elf.Header32{Type: uint16(elf.ET_DYN), Machine: uint16(elf.EM_386), Version: 1, Phoff: uint32(ehsize),
			Shoff: uint32(shoff), Ehsize: uint16(ehsize), Phentsize: uint16(phsize), Phnum: 1,
			Shentsize: uint16(shsize), Shnum: uint16(len(secs) + 1), Shstrndx: uint16(len(secs))}
		copy(hdr.Ident[:], "\x7fELF\x01\x01\x01")
		binary.Encode(out, le, hdr)
		binary.Encode(out[ehsize:], le, elf.Prog32{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X),
			Filesz: uint32(len(out)), Memsz: uint32(len(out)), Align: 0x1000})
		return out
	}
	for _, s := range append([]sec{{}}, secs...) {
		out, _ = binary.Append(out, le, elf.Section64{Name: uint32(s.name), Type: uint32(s.typ), Link: uint32(s.link),
			Off: uint64(s.off), Size: uint64(s.size), Entsize: uint64(s.entsize), Addralign: 1})
	}
	hdr := elf.Header64{Type: uint16(elf.ET_DYN), Machine: uint16(elf.EM_X86_64), Version: 1, Phoff: uint64(ehsize),
		Shoff: uint64(shoff), Ehsize: uint16(ehsize), Phentsize: uint16(phsize), Phnum: 1,
		Shentsize: uint16(shsize), Shnum: uint16(len(secs) + 1), Shstrndx: uint16(len(secs))}
	copy(hdr.Ident[:], "\x7fELF\x02\x01\x01")
	binary.Encode(out, le, hdr)
	binary.Encode(out[ehsize:], le, elf.Prog64{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X),
		Filesz: uint64(len(out)), Memsz: uint64(len(out)), Align: 0x1000})
	return out
}

// rawNamesFit says whether every entry's name offset is below nameTable:
// the index leaves out the others, which debug/elf names "".
func rawNamesFit(syms []byte, elf32 bool) bool {
	size := sym64Size
	if elf32 {
		size = sym32Size
	}
	for i := 0; i+size <= len(syms); i += size {
		if binary.LittleEndian.Uint32(syms[i:]) >= nameTable {
			return false
		}
	}
	return true
}

// FuzzSymbolTable: any symbol tables name every function at its address
// as debug/elf's eager read does (the first symbol listed at an address,
// .symtab before .dynsym), demangled within bounds.
func FuzzSymbolTable(f *testing.F) {
	f.Fuzz(func(t *testing.T, symtab, strtab, dynsym, dynstr []byte, elf32 bool, addr uint64) {
		data := synthELF(symtab, strtab, dynsym, dynstr, elf32)
		e, err := parseELF(data)
		if err != nil {
			t.Fatalf("a well-formed file refused: %v", err)
		}
		tb := fuzzTable(data, e, maxFuzzEntries)
		tb.lookup(addr)
		checkTable(t, tb, data)
		ef, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		seen := map[uint64]bool{}
		checked := 0
		for _, read := range []func() ([]elf.Symbol, error){ef.Symbols, ef.DynamicSymbols} {
			syms, err := read()
			if err != nil || !rawNamesFit(symtab, elf32) || !rawNamesFit(dynsym, elf32) || len(tb.index) == 0 {
				return // debug/elf refuses a table with a partial entry; the index reads its whole ones
			}
			for _, s := range syms {
				if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Value == 0 || seen[s.Value] {
					continue
				}
				seen[s.Value] = true
				if checked++; checked > 64 {
					return
				}
				if got, want := tb.lookup(s.Value), demangleName(s.Name); got != want {
					t.Fatalf("%#x: %q, debug/elf %q", s.Value, got, want)
				}
			}
		}
	})
}
