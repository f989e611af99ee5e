// Decoding x86-64 code, for the return instructions of a function.

package tracer

import (
	"debug/elf"

	"golang.org/x/arch/x86/x86asm"
)

// returnInstructions decodes the function's code (x86-64) and returns the
// offsets of its ret instructions; none when it cannot be read or decoded
// to its end.
func returnInstructions(f *elf.File, sym elf.Symbol) []uint64 {
	var code []byte
	for _, sec := range f.Sections {
		if sec.Type == elf.SHT_PROGBITS && sec.Flags&elf.SHF_EXECINSTR != 0 &&
			sym.Value >= sec.Addr && sym.Value+sym.Size <= sec.Addr+sec.Size {
			code = make([]byte, sym.Size)
			if _, err := sec.ReadAt(code, int64(sym.Value-sec.Addr)); err != nil {
				return nil
			}
		}
	}
	var rets []uint64
	for off := 0; off < len(code); {
		inst, err := x86asm.Decode(code[off:], 64)
		if err != nil {
			return nil
		}
		if inst.Op == x86asm.RET {
			rets = append(rets, uint64(off))
		}
		off += inst.Len
	}
	return rets
}
