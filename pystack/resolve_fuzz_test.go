package pystack

import (
	"cmp"
	"encoding/binary"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/tracer"
)

// segment is bytes of a process's memory at an address.
type segment struct {
	addr uint64
	data []byte
}

// segmentMemory is a process's memory made of segments; an address in none
// reads as the fill pattern (repeated, from address 0) when there is one:
// then every pointer leads somewhere and every count may be large. It
// counts the reads.
type segmentMemory struct {
	segs         []segment // by address
	fill         []byte
	reads, bytes int
}

// parseSegments reads fuzzed memory: segments of an 8-byte address, a
// 4-byte length and the bytes, one after the other.
func parseSegments(b []byte) []segment {
	var segs []segment
	for len(b) >= 12 {
		addr, n := binary.LittleEndian.Uint64(b), int(binary.LittleEndian.Uint32(b[8:]))
		b = b[12:]
		n = min(n, len(b))
		segs = append(segs, segment{addr, b[:n]})
		b = b[n:]
	}
	slices.SortStableFunc(segs, func(a, b segment) int { return cmp.Compare(a.addr, b.addr) })
	return segs
}

func encodeSegments(segs []segment) []byte {
	var out []byte
	for _, s := range segs {
		out = binary.LittleEndian.AppendUint64(out, s.addr)
		out = binary.LittleEndian.AppendUint32(out, uint32(len(s.data)))
		out = append(out, s.data...)
	}
	return out
}

func (m *segmentMemory) ReadAt(buf []byte, off int64) (int, error) {
	m.reads++
	m.bytes += len(buf)
	addr := uint64(off)
	n := 0
	if i := sort(m.segs, addr); i >= 0 && addr-m.segs[i].addr < uint64(len(m.segs[i].data)) {
		n = copy(buf, m.segs[i].data[addr-m.segs[i].addr:])
	}
	if n == len(buf) {
		return n, nil
	}
	if len(m.fill) == 0 {
		return n, io.EOF
	}
	for j := n; j < len(buf); {
		j += copy(buf[j:], m.fill[(addr+uint64(j))%uint64(len(m.fill)):])
	}
	return len(buf), nil
}

// sort is the last segment at or below addr, -1 if none.
func sort(segs []segment, addr uint64) int {
	i, _ := slices.BinarySearchFunc(segs, addr+1, func(s segment, a uint64) int { return cmp.Compare(s.addr, a) })
	return i - 1
}

var fuzzVersions = []string{"3.10", "3.11", "3.12", "3.13"}

// fuzzLayout is the layout a fuzzed process has: a version's, or for a
// version past those, the fuzzed bytes (3.13 reads its layout from the
// interpreter's file, which is untrusted). The seeds' bytes are a Layout
// as binary.Append wrote it: a field added to Layout shifts those after
// it, so the seeds are recorded again (make fuzz-seeds RECORD=1).
func fuzzLayout(version uint8, raw []byte) Layout {
	if int(version) < len(fuzzVersions) {
		return layouts[fuzzVersions[version]]
	}
	var l Layout
	raw = append(slices.Clone(raw), make([]byte, binary.Size(l))...)
	binary.Decode(raw, binary.LittleEndian, &l)
	return l
}

func encodeFrames(frames []tracer.PyFrame) []byte {
	var out []byte
	for _, f := range frames {
		out = binary.LittleEndian.AppendUint64(out, f.Code)
		out = binary.LittleEndian.AppendUint64(out, f.Instr)
		out = binary.LittleEndian.AppendUint64(out, f.Class)
	}
	return out
}

func decodeFrames(b []byte) []tracer.PyFrame {
	var frames []tracer.PyFrame
	for len(b) >= 24 && len(frames) < 16 {
		frames = append(frames, tracer.PyFrame{Code: binary.LittleEndian.Uint64(b), Instr: binary.LittleEndian.Uint64(b[8:]), Class: binary.LittleEndian.Uint64(b[16:])})
		b = b[24:]
	}
	return frames
}

// FuzzFrames names frames in a process whose memory, layout, runtime
// address and frames are fuzzed: no panic, every Frames call within its
// budget of reads and bytes, names of bounded length. The fuzzer runs with
// a budget smaller than the agent's, to run fast: 2^13 reads, where naming
// the 3.10 seeds' frames takes 4269 and an input that spends the budget
// (regression-sys-modules-loop) costs 4 ms for its two calls.
// TestHostileMemory checks the agent's.
func FuzzFrames(f *testing.F) {
	saved := budget
	budget.reads, budget.bytes = 1<<13, 16<<20
	f.Cleanup(func() { budget = saved })
	f.Fuzz(func(t *testing.T, mem, frames, layout []byte, version uint8, runtime uint64, fill []byte) {
		m := &segmentMemory{segs: parseSegments(mem), fill: fill[:min(len(fill), 64)]}
		r := resolverOver(m, fuzzLayout(version, layout), runtime)
		fs := decodeFrames(frames)
		for round := range 2 { // the second from the caches
			reads, bytes := m.reads, m.bytes
			out := r.Frames(1, fs)
			if m.reads-reads > budget.reads || m.bytes-bytes > budget.bytes {
				t.Fatalf("round %d: %d reads of %d bytes, budget %d of %d", round, m.reads-reads, m.bytes-bytes, budget.reads, budget.bytes)
			}
			for _, fr := range out {
				if len(fr.Function) > 1<<20 || len(fr.File) > 1<<20 {
					t.Fatalf("a name of %d bytes, a file of %d", len(fr.Function), len(fr.File))
				}
			}
		}
	})
}

// resolverOver is a Resolver of one process (PID 1) whose memory is r.
func resolverOver(r io.ReaderAt, l Layout, runtime uint64) *Resolver {
	res := NewResolver()
	res.procs[1] = &process{Process: &Process{PID: 1, Runtime: runtime, Layout: l}, mem: newMemory(r, nil),
		codes: map[uint64]*code{}, classes: map[uint64]string{}}
	return res
}

// modulesLoop is a 3.10 process whose sys.modules holds 16384 entries,
// each a module whose dict is sys.modules itself, none with a __file__:
// naming a frame of a function in a file reads every module's dict, 16384
// entries of 16384 (800 million reads, 6 GB). The dicts' entries are the
// fill pattern, not segments: a few hundred bytes describe it all.
func modulesLoop() (mem, frames []byte, runtime uint64, fill []byte) {
	const (
		rt, interp, modules, keys = 0x10000, 0x20000, 0x30000, 0x40000
		module, moduleType, str   = 0x1000000, 0x1001000, 0x1002000
		typeName, code, fileName  = 0x1003000, 0x1004000, 0x1005000
		size, entries             = 1 << 16, 1 << 14
	)
	word := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
	at := func(off int, b []byte) []byte { return append(make([]byte, off), b...) }
	object := func(fields map[int]uint64, n int) []byte {
		b := make([]byte, n)
		for off, v := range fields {
			binary.LittleEndian.PutUint64(b[off:], v)
		}
		return b
	}
	ascii := func(s string) []byte { // a compact ASCII str
		b := object(map[int]uint64{16: uint64(len(s)), 32: 0x64}, 48)
		return append(b, s...)
	}
	l := layouts["3.10"].Names310
	segs := []segment{
		{rt, at(32, word(interp))},
		{interp, at(int(l.InterpModules), word(modules))},
		{modules, object(map[int]uint64{int(l.DictVersion): 1, int(l.DictKeys): keys}, 48)},
		{keys, object(map[int]uint64{keysSize: size, keysNentries: entries}, keysIndices)},
		{module, object(map[int]uint64{obType: moduleType, int(l.ModuleDict): modules}, 24)},
		{moduleType, object(map[int]uint64{24: typeName}, 176)},
		{typeName, []byte("module\x00")},
		{str, ascii("__nope__")},
		{fileName, ascii("/srv/model.py")},
		{code, object(map[int]uint64{104: fileName, 112: str, 120: str, 72: 0}, 128)},
	}
	// The entries (hash, key, value) start at keys + 40 + 4*size, a
	// multiple of 24: the pattern lines up with them.
	if (keys+keysIndices+4*size)%keyEntrySize != 0 {
		panic("entries not aligned with the fill pattern")
	}
	fill = slices.Concat(word(1), word(str), word(module))
	return encodeSegments(segs), encodeFrames([]tracer.PyFrame{{Code: code, Instr: 2}}), rt, fill
}

// TestHostileMemory: with the agent's budget, memory built to make naming
// one frame read for hours (modulesLoop), memory where every pointer leads
// somewhere, and code objects of 200 KB each, made up by the thousand,
// cost one Frames call its budget and no more, and what is cached stays
// bounded.
func TestHostileMemory(t *testing.T) {
	mem, frames, runtime, fill := modulesLoop()
	cases := map[string]struct {
		m       *segmentMemory
		layout  Layout
		runtime uint64
		frames  []tracer.PyFrame
	}{
		"sys.modules loop": {&segmentMemory{segs: parseSegments(mem), fill: fill}, layouts["3.10"], runtime, decodeFrames(frames)},
	}
	for _, v := range fuzzVersions {
		cases[v+" filled"] = struct {
			m       *segmentMemory
			layout  Layout
			runtime uint64
			frames  []tracer.PyFrame
		}{&segmentMemory{fill: []byte{0x64, 0, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0}}, layouts[v], 0x1000,
			[]tracer.PyFrame{{Code: 0x2000, Instr: 0x2100, Class: 0x3000}, {Code: 0x4000, Class: 0x5000}}}
	}
	// Every pointer to a string of 65000 ASCII bytes, also read as a line
	// table as long: each new code object costs 200 KB to cache, and a
	// process can make up any number of them.
	str := make([]byte, 48)
	binary.LittleEndian.PutUint64(str[16:], 65000)
	binary.LittleEndian.PutUint64(str[32:], 0x64)
	large := binary.LittleEndian.AppendUint64(nil, 0x10000)
	var many []tracer.PyFrame
	for i := range 16 {
		many = append(many, tracer.PyFrame{Code: 0x100000 + uint64(i)*0x1000, Instr: 0x100000})
	}
	cases["3.12 large strings"] = struct {
		m       *segmentMemory
		layout  Layout
		runtime uint64
		frames  []tracer.PyFrame
	}{&segmentMemory{segs: []segment{{0x10000, str}}, fill: large}, layouts["3.12"], 0x1000, many}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r := resolverOver(c.m, c.layout, c.runtime)
			start := time.Now()
			for i := range 100 {
				reads, bytes := c.m.reads, c.m.bytes
				r.Frames(1, c.frames)
				if c.m.reads-reads > budget.reads || c.m.bytes-bytes > budget.bytes {
					t.Fatalf("call %d: %d reads of %d bytes", i, c.m.reads-reads, c.m.bytes-bytes)
				}
				for j := range c.frames {
					c.frames[j].Code += 0x10 // new code objects: no cache
				}
			}
			p := r.procs[1]
			held := 0
			for _, c := range p.codes {
				held += len(c.qualname) + len(c.filename) + len(c.linetable)
			}
			t.Logf("%d reads, %d bytes in %v; %d bytes cached (%d in code objects)", c.m.reads, c.m.bytes, time.Since(start), p.cacheBytes, held)
			if p.cacheBytes > maxCacheBytes+budget.bytes || held > p.cacheBytes {
				t.Errorf("%d bytes cached, %d in code objects", p.cacheBytes, held)
			}
		})
	}
}

// FuzzLineTable: any line table gives a line or 0, reading no byte past
// its end.
func FuzzLineTable(f *testing.F) {
	f.Fuzz(func(t *testing.T, table []byte, firstLine int, index int) {
		line310(table, firstLine, index)
		line311(table, firstLine, index)
	})
}
