package pystack

// line310 returns the line of the instruction at byte offset addr, from a
// 3.10 co_linetable: pairs of (bytecode bytes, signed line delta), -128
// meaning no line. 0 when the instruction has none.
func line310(table []byte, firstLine int, addr int) int {
	line, start := firstLine, 0
	for i := 0; i+1 < len(table); i += 2 {
		end := start + int(table[i])
		delta := int(int8(table[i+1]))
		if delta != -128 {
			line += delta
		}
		if start <= addr && addr < end {
			if delta == -128 {
				return 0
			}
			return line
		}
		start = end
	}
	return 0
}

// line311 returns the line of the instruction at index (in code units) from
// a 3.11+ co_linetable, the location table of PEP 657. 0 when it has none.
func line311(table []byte, firstLine int, index int) int {
	r := locationReader{table: table}
	line, start := firstLine, 0
	for r.pos < len(table) {
		first := r.byte()
		if first&0x80 == 0 {
			return 0 // not at an entry: the table is corrupt
		}
		code := int(first>>3) & 15
		end := start + int(first&7) + 1
		hasLine := true
		switch {
		case code == 15: // no location
			hasLine = false
		case code == 14: // long form
			line += r.svarint()
			r.varint() // end line delta
			r.varint() // column
			r.varint() // end column
		case code == 13: // no column
			line += r.svarint()
		case code >= 10: // one line, delta code-10, two column bytes
			line += code - 10
			r.pos += 2
		default: // short form: same line, one column byte
			r.pos++
		}
		if start <= index && index < end {
			if !hasLine {
				return 0
			}
			return line
		}
		start = end
	}
	return 0
}

type locationReader struct {
	table []byte
	pos   int
}

func (r *locationReader) byte() byte {
	if r.pos >= len(r.table) {
		r.pos++
		return 0
	}
	b := r.table[r.pos]
	r.pos++
	return b
}

func (r *locationReader) varint() int {
	b := int(r.byte())
	v := b & 63
	for shift := 6; b&64 != 0 && shift < 64; shift += 6 {
		b = int(r.byte())
		v |= (b & 63) << shift
	}
	return v
}

func (r *locationReader) svarint() int {
	v := r.varint()
	if v&1 != 0 {
		return -(v >> 1)
	}
	return v >> 1
}
