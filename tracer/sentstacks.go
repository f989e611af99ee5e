// Naming again the Python stacks the BPF program sent only by their hash.

package tracer

import (
	"math/bits"
	"slices"

	"github.com/gpu-mem/gpu-mem/memory"
)

// pySentBefore marks an event whose Python frames its thread sent whole
// before: its one frame holds their hash (Code) and count (Instr). Read
// names them again, so that no caller sees it.
const pySentBefore = StackFlags(gpumemGpumemStackFlagGPUMEM_PY_SENT_BEFORE)

// sentStacks keeps the Python frames of each process's tensor allocations
// by their hash, for the later events that name them (name_sent_stack in
// gadgets/include/gpumem/sent_stacks.h). A process's stacks are kept until
// it exits: a thread names only stacks it sent, each sent ahead of the
// events naming it in the one ring buffer.
type sentStacks struct {
	byPID map[uint32]map[uint64][]PyFrame
	named uint64 // events whose frames were named
}

// resolve keeps or names ev's Python frames, and forgets an exited
// process's.
func (s *sentStacks) resolve(ev *Event) {
	switch {
	case ev.Exit:
		delete(s.byPID, ev.PID)
	case ev.Flags&pySentBefore != 0:
		s.name(ev)
	case ev.Op == memory.OpTensorAlloc && len(ev.PyFrames) > 1:
		s.keep(ev)
	}
}

func (s *sentStacks) keep(ev *Event) {
	stacks := s.byPID[ev.PID]
	if stacks == nil {
		if s.byPID == nil {
			s.byPID = map[uint32]map[uint64][]PyFrame{}
		}
		stacks = map[uint64][]PyFrame{}
		s.byPID[ev.PID] = stacks
	}
	h := pyStackHash(ev.PyFrames)
	if !slices.Equal(stacks[h], ev.PyFrames) { // a pid reused since an exit not reported
		stacks[h] = slices.Clone(ev.PyFrames)
	}
}

// name puts back the frames ev names. Frames it cannot find (a stack
// never read, or a record not as program.bpf.c writes it: a bug) leave
// ev's Python stack empty and flagged broken.
func (s *sentStacks) name(ev *Event) {
	ev.Flags &^= pySentBefore
	var frames []PyFrame
	if len(ev.PyFrames) == 1 {
		frames = s.byPID[ev.PID][ev.PyFrames[0].Code]
	}
	if len(frames) == 0 || uint64(len(frames)) != ev.PyFrames[0].Instr {
		ev.PyFrames = ev.PyFrames[:0]
		ev.Flags |= PyReadError
		return
	}
	ev.PyFrames = append(ev.PyFrames[:0], frames...)
	s.named++
}

// pyStackHash is python_stack_hash (gadgets/include/gpumem/sent_stacks.h)
// of frames.
func pyStackHash(frames []PyFrame) uint64 {
	const codeMul, restMul = 0x9e3779b97f4a7c15, 0xc2b2ae3d27d4eb4f
	code, rest := uint64(codeMul), uint64(restMul)
	for _, f := range frames {
		var flags uint64
		if f.Entry {
			flags = uint64(gpumemGpumemPyframeFlagGPUMEM_PYFRAME_ENTRY) << 56
		}
		code = (code ^ f.Code ^ bits.RotateLeft64(f.Class, 32)) * codeMul
		rest = (rest ^ f.Instr ^ flags) * restMul
	}
	h := code ^ bits.RotateLeft64(rest, 32) ^ uint64(len(frames))
	h = (h ^ h>>31) * codeMul
	return (h ^ h>>29) | 1
}
