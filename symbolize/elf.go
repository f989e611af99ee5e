package symbolize

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"math"
)

// elfFile is what a table needs of an ELF file. Its slices point into the
// mapped file: reading it allocates nothing per symbol.
type elfFile struct {
	loads   []load
	symtabs []symbolSection // .symtab first, then .dynsym: the first symbol at an address wins
	buildID []byte          // the GNU build ID; nil when the file has none
}

// load is a PT_LOAD segment: where file offsets land in the ELF address space.
type load struct{ off, filesz, vaddr uint64 }

// symbolSection is a symbol table and the string table its names point into.
type symbolSection struct {
	syms  []byte
	strs  []byte
	class elf.Class
	order binary.ByteOrder
}

// elfSymbol is the part of a symbol entry that naming needs.
type elfSymbol struct {
	name        uint32 // offset in the string table
	info        byte
	value, size uint64
}

const (
	sym32Size = 16
	sym64Size = 24
	// maxBuildID bounds a build ID read from a note: real ones are 8 to 32
	// bytes, and a hostile note must not make a key of any size.
	maxBuildID   = 64
	ntGNUBuildID = 3
)

// parseELF reads the headers of a mapped ELF file. debug/elf parses only the
// file and section headers here (bounded by the file's size); symbol entries
// are decoded from the mapped bytes when an index is built.
func parseELF(data []byte) (*elfFile, error) {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("parse ELF: %w", err)
	}
	e := &elfFile{}
	for _, p := range f.Progs {
		switch p.Type {
		case elf.PT_LOAD:
			e.loads = append(e.loads, load{off: p.Off, filesz: p.Filesz, vaddr: p.Vaddr})
		case elf.PT_NOTE:
			if e.buildID == nil {
				e.buildID = buildID(fileRange(data, p.Off, p.Filesz), f.ByteOrder, p.Align)
			}
		}
	}
	for _, s := range f.Sections {
		if e.buildID == nil && s.Type == elf.SHT_NOTE {
			e.buildID = buildID(fileRange(data, s.Offset, s.FileSize), f.ByteOrder, s.Addralign)
		}
	}
	for _, typ := range []elf.SectionType{elf.SHT_SYMTAB, elf.SHT_DYNSYM} {
		if st, ok := symbols(f, data, typ); ok {
			e.symtabs = append(e.symtabs, st)
		}
	}
	return e, nil
}

// symbols finds the first symbol table of a type and its string table, as
// debug/elf's Symbols and DynamicSymbols do; a table whose bytes are not
// all in the file is left out.
func symbols(f *elf.File, data []byte, typ elf.SectionType) (symbolSection, bool) {
	s := f.SectionByType(typ)
	if s == nil || s.Link == 0 || int(s.Link) >= len(f.Sections) {
		return symbolSection{}, false
	}
	strs := f.Sections[s.Link]
	st := symbolSection{
		syms:  fileRange(data, s.Offset, s.FileSize),
		strs:  fileRange(data, strs.Offset, strs.FileSize),
		class: f.Class,
		order: f.ByteOrder,
	}
	if st.syms == nil || st.strs == nil || s.Type == elf.SHT_NOBITS || strs.Type == elf.SHT_NOBITS {
		return symbolSection{}, false
	}
	return st, st.class == elf.ELFCLASS64 || st.class == elf.ELFCLASS32
}

// fileRange is data[off:off+size], or nil when that is not all in the file.
func fileRange(data []byte, off, size uint64) []byte {
	if off > uint64(len(data)) || size > uint64(len(data))-off {
		return nil
	}
	return data[off : off+size]
}

// buildID finds the GNU build ID among a run of notes. Each note takes at
// least 12 bytes, so the loop ends within len(notes)/12 steps.
func buildID(notes []byte, order binary.ByteOrder, align uint64) []byte {
	pad := uint64(4)
	if align == 8 {
		pad = 8
	}
	for len(notes) >= 12 {
		namesz, descsz, typ := uint64(order.Uint32(notes)), uint64(order.Uint32(notes[4:])), order.Uint32(notes[8:])
		rest := notes[12:]
		descOff := roundUp(namesz, pad)
		if descOff > uint64(len(rest)) || descsz > uint64(len(rest))-descOff {
			return nil
		}
		if typ == ntGNUBuildID && string(rest[:namesz]) == "GNU\x00" {
			if descsz == 0 || descsz > maxBuildID {
				return nil
			}
			return bytes.Clone(rest[descOff : descOff+descsz])
		}
		next := descOff + roundUp(descsz, pad)
		if next >= uint64(len(rest)) {
			return nil
		}
		notes = rest[next:]
	}
	return nil
}

func roundUp(n, to uint64) uint64 {
	if n > math.MaxUint64-to {
		return math.MaxUint64
	}
	return (n + to - 1) / to * to
}

// count is how many whole entries the table holds.
func (st symbolSection) count() int {
	if st.class == elf.ELFCLASS64 {
		return len(st.syms) / sym64Size
	}
	return len(st.syms) / sym32Size
}

// symbol decodes entry i (0 <= i < count()).
func (st symbolSection) symbol(i int) elfSymbol {
	o := st.order
	if st.class == elf.ELFCLASS64 {
		b := st.syms[i*sym64Size : (i+1)*sym64Size]
		return elfSymbol{name: o.Uint32(b), info: b[4], value: o.Uint64(b[8:]), size: o.Uint64(b[16:])}
	}
	b := st.syms[i*sym32Size : (i+1)*sym32Size]
	return elfSymbol{name: o.Uint32(b), value: uint64(o.Uint32(b[4:])), size: uint64(o.Uint32(b[8:])), info: b[12]}
}

// isFunction says whether a symbol names code: the eager reader kept
// STT_FUNC symbols with an address, and so does the index.
func (sym elfSymbol) isFunction() bool {
	return elf.ST_TYPE(sym.info) == elf.STT_FUNC && sym.value != 0
}

// maxRawName bounds a symbol's name as the file holds it: a real mangled
// name takes up to tens of kilobytes, and one without an end in a string
// table of gigabytes must not be copied whole.
const maxRawName = 1 << 20

// name reads the NUL-terminated string at off, as debug/elf does: empty
// when off is outside the table or the string has no end within
// maxRawName bytes.
func (st symbolSection) name(off uint32) string {
	if uint64(off) >= uint64(len(st.strs)) {
		return ""
	}
	strs := st.strs[off:]
	end := bytes.IndexByte(strs[:min(len(strs), maxRawName)], 0)
	if end < 0 {
		return ""
	}
	return string(strs[:end])
}
