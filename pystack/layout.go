// Package pystack reads Python stacks from outside the interpreter: it finds
// a process's CPython runtime and the layout of its structures, hands the
// BPF program what it needs to walk a thread's frames, and names the frames
// it captured.
package pystack

import (
	"fmt"

	"github.com/gpu-mem/gpu-mem/tracer"
)

// Layout is where CPython keeps what gpu-mem reads, in bytes, for one minor
// version. Offsets were taken from each version's internal headers and are
// checked against them by TestLayoutsMatchHeaders; 3.13 reads its own from
// _Py_DebugOffsets.
type Layout struct {
	// The walk from _PyRuntime to a thread's frames (see struct
	// gpumem_python); tracer.PyNoField where a version lacks the field.
	RuntimeInterpretersHead uint16
	InterpNext              uint16
	InterpThreadsHead       uint16
	TstateNext              uint16
	TstateInterp            uint16
	TstateThreadID          uint16
	TstateFrame             uint16
	CframeCurrentFrame      uint16
	FramePrevious           uint16
	FrameCode               uint16
	FrameInstr              uint16
	FrameOwner              uint16
	FrameIsEntry            uint16
	FrameLocalsplus         uint16
	TypeFlags               uint16
	TstateDatastackChunk    uint16 // 3.11+: the chunk of the data stack holding the frames
	InstrSize               uint8  // 4: f_lasti, an index; 8: an instruction pointer
	OwnerCstack             uint8  // owner of C-stack shim frames; 0: no shims

	// Code objects and the objects they point to.
	CodeFilename    uint16
	CodeName        uint16
	CodeQualname    uint16 // tracer.PyNoField before 3.11
	CodeFirstlineno uint16
	CodeLinetable   uint16
	CodeAdaptive    uint16 // first instruction, 3.11+
	CodeVarnames    uint16 // 3.10: the tuple naming self or cls
	UnicodeASCII    uint16 // sizeof(PyASCIIObject): ASCII text follows
	UnicodeCompact  uint16 // sizeof(PyCompactUnicodeObject): other text follows
	BytesData       uint16
	TupleItems      uint16
	TypeName        uint16

	Names310 Names310 // zero after 3.10
}

// Names310 is where 3.10, whose code objects have no qualified name, keeps
// what names a function the way co_qualname does in 3.11+: classes, their
// dicts, functions, modules (qualname310.go).
type Names310 struct {
	InterpModules    uint16 // PyInterpreterState.modules: sys.modules
	ModuleDict       uint16
	TypeDict         uint16
	TypeMro          uint16
	HeapTypeQualname uint16
	DictVersion      uint16 // ma_version_tag: changes with every change
	DictKeys         uint16
	DictValues       uint16 // non-NULL: a split table
	FuncCode         uint16
	FuncQualname     uint16
}

const no = tracer.PyNoField

var layouts = map[string]Layout{
	"3.10": {
		RuntimeInterpretersHead: 32, InterpNext: 0, InterpThreadsHead: 8,
		TstateNext: 8, TstateInterp: 16, TstateThreadID: 176, TstateFrame: 24, CframeCurrentFrame: no,
		FramePrevious: 24, FrameCode: 32, FrameInstr: 96, FrameOwner: no, FrameIsEntry: no,
		FrameLocalsplus: 352, TypeFlags: 168, TstateDatastackChunk: no, InstrSize: 4,
		CodeFilename: 104, CodeName: 112, CodeQualname: no, CodeFirstlineno: 40, CodeLinetable: 120,
		CodeAdaptive: no, CodeVarnames: 72, UnicodeASCII: 48, UnicodeCompact: 72,
		BytesData: 32, TupleItems: 24, TypeName: 24,
		Names310: Names310{
			InterpModules: 856, ModuleDict: 16, TypeDict: 264, TypeMro: 344, HeapTypeQualname: 864,
			DictVersion: 24, DictKeys: 32, DictValues: 40, FuncCode: 48, FuncQualname: 40,
		},
	},
	"3.11": {
		RuntimeInterpretersHead: 40, InterpNext: 0, InterpThreadsHead: 16,
		TstateNext: 8, TstateInterp: 16, TstateThreadID: 152, TstateFrame: 56, CframeCurrentFrame: 8,
		FramePrevious: 48, FrameCode: 32, FrameInstr: 56, FrameOwner: 69, FrameIsEntry: 68,
		FrameLocalsplus: no, TypeFlags: no, TstateDatastackChunk: 296, InstrSize: 8,
		CodeFilename: 112, CodeName: 120, CodeQualname: 128, CodeFirstlineno: 72, CodeLinetable: 136,
		CodeAdaptive: 184, CodeVarnames: no, UnicodeASCII: 48, UnicodeCompact: 72,
		BytesData: 32, TupleItems: 24, TypeName: 24,
	},
	"3.12": {
		RuntimeInterpretersHead: 40, InterpNext: 0, InterpThreadsHead: 72,
		TstateNext: 8, TstateInterp: 16, TstateThreadID: 136, TstateFrame: 56, CframeCurrentFrame: 0,
		FramePrevious: 8, FrameCode: 0, FrameInstr: 56, FrameOwner: 70, FrameIsEntry: no,
		FrameLocalsplus: no, TypeFlags: no, TstateDatastackChunk: 232, InstrSize: 8, OwnerCstack: 3,
		CodeFilename: 112, CodeName: 120, CodeQualname: 128, CodeFirstlineno: 68, CodeLinetable: 136,
		CodeAdaptive: 192, CodeVarnames: no, UnicodeASCII: 40, UnicodeCompact: 56,
		BytesData: 32, TupleItems: 24, TypeName: 24,
	},
	"3.13": {
		RuntimeInterpretersHead: 632, InterpNext: 7264, InterpThreadsHead: 7344,
		TstateNext: 8, TstateInterp: 16, TstateThreadID: 152, TstateFrame: 72, CframeCurrentFrame: no,
		FramePrevious: 8, FrameCode: 0, FrameInstr: 56, FrameOwner: 70, FrameIsEntry: no,
		FrameLocalsplus: no, TypeFlags: no, TstateDatastackChunk: 232, InstrSize: 8, OwnerCstack: 3,
		CodeFilename: 112, CodeName: 120, CodeQualname: 128, CodeFirstlineno: 68, CodeLinetable: 136,
		CodeAdaptive: 200, CodeVarnames: no, UnicodeASCII: 40, UnicodeCompact: 56,
		BytesData: 32, TupleItems: 24, TypeName: 24,
	},
}

// The BPF program reads a thread state's fields from its frame's on, its
// first tstateHead bytes (GPUMEM_PY_TSTATE_HEAD), and a frame's first
// frameHead bytes (GPUMEM_PY_FRAME_HEAD), or, at the end of a mapping, its
// first frameMin (GPUMEM_PY_FRAME_MIN) where frames live on a data stack
// (3.11+: 3.10's are heap objects of 352 bytes and more), each at once:
// the fields it follows must lie in them.
const (
	tstateHead = 256
	frameHead  = 128
	frameMin   = 72
)

type field struct {
	name      string
	off, size uint16
}

// checkReadAtOnce says whether the fields the walk follows lie where the
// BPF program reads them, and those it reads as 8 bytes (the instruction
// too, cut to its size after) at offsets that are multiples of 8 from where
// it reads them: it loads those at once (aligned_u64).
func (l Layout) checkReadAtOnce() error {
	thread := []field{{"thread id", l.TstateThreadID, 8}, {"data stack chunk", l.TstateDatastackChunk, 8}}
	if err := checkFields("thread state's", thread, l.TstateFrame, tstateHead); err != nil {
		return err
	}
	end := uint16(frameHead)
	if l.TstateDatastackChunk != no {
		end = frameMin
	}
	frame := []field{
		{"previous", l.FramePrevious, 8}, {"code", l.FrameCode, 8}, {"instruction", l.FrameInstr, uint16(l.InstrSize)},
		{"owner", l.FrameOwner, 1}, {"is_entry", l.FrameIsEntry, 1},
	}
	if err := checkFields("frame's", frame, 0, end); err != nil {
		return err
	}
	if err := checkAligned("thread state's", thread, l.TstateFrame); err != nil {
		return err
	}
	return checkAligned("frame's", frame[:3], 0)
}

// checkFields says whether fields lie within n bytes from offset from.
func checkFields(of string, fields []field, from, n uint16) error {
	for _, f := range fields {
		if f.off != no && (f.off < from || f.off+f.size > from+n) {
			return fmt.Errorf("a %s %s at offset %d: outside the %d bytes from %d read at once", of, f.name, f.off, n, from)
		}
	}
	return nil
}

// checkAligned says whether fields lie at multiples of 8 bytes from offset
// from.
func checkAligned(of string, fields []field, from uint16) error {
	for _, f := range fields {
		if f.off != no && (f.off-from)%8 != 0 {
			return fmt.Errorf("a %s %s at offset %d: not a multiple of 8 bytes from %d", of, f.name, f.off, from)
		}
	}
	return nil
}

// walk is what the BPF program needs for a process whose _PyRuntime is at
// runtime.
func (l Layout) walk(runtime uint64) tracer.PythonWalk {
	return tracer.PythonWalk{
		Runtime:                 runtime,
		RuntimeInterpretersHead: l.RuntimeInterpretersHead,
		InterpNext:              l.InterpNext,
		InterpThreadsHead:       l.InterpThreadsHead,
		TstateNext:              l.TstateNext,
		TstateThreadId:          l.TstateThreadID,
		TstateFrame:             l.TstateFrame,
		CframeCurrentFrame:      l.CframeCurrentFrame,
		FramePrevious:           l.FramePrevious,
		FrameCode:               l.FrameCode,
		FrameInstr:              l.FrameInstr,
		FrameOwner:              l.FrameOwner,
		FrameIsEntry:            l.FrameIsEntry,
		FrameLocalsplus:         l.FrameLocalsplus,
		TypeFlags:               l.TypeFlags,
		TstateDatastackChunk:    l.TstateDatastackChunk,
		InstrSize:               l.InstrSize,
		OwnerCstack:             l.OwnerCstack,
	}
}
