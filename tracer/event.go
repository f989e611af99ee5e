// Decoding the ring buffer's records into Events.

package tracer

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpu-mem/gpu-mem/memory"
)

// Event is one driver call, or the exit of a traced process.
type Event struct {
	Exit      bool      // the last thread of process PID exited; only PID, TID, Comm are set
	Op        memory.Op // the driver function
	Result    int32     // its CUresult
	PID, TID  uint32    //
	Comm      string    // the calling thread's; a tensor's only when it has no Python frames
	Address   uint64    // pointer or VMM handle allocated or freed
	Bytes     uint64    // allocated bytes; requested bytes when the call failed
	Device    int32     // device ordinal of the calling thread's context, or DeviceUnknown
	Timestamp uint64    // ns since boot: an allocation's return, a free's entry
	Began     uint64    // a context made or a module loaded: ns since boot at its call's entry
	// Stack holds user return addresses, innermost first, taken when the
	// driver call returned: the first is in the caller of the driver.
	Stack []uint64
	// PyFrames are the calling thread's Python frames, innermost first,
	// when the process is a registered Python process.
	PyFrames []PyFrame
	Flags    StackFlags
	// Carried, set alone, is the counters a compaction of the journal
	// carried (Compaction.Carried), replayed before its events.
	Carried []byte
}

// PyFrame is one Python frame as the BPF program read it; package pystack
// names it.
type PyFrame struct {
	Code  uint64 // PyCodeObject address
	Instr uint64 // f_lasti (3.10) or the instruction pointer
	Class uint64 // 3.10: the class of self or cls, else 0
	// Entry marks the first frame run by a native call of the evaluation
	// loop: the Python frames of one _PyEval_EvalFrameDefault end with it.
	Entry bool
}

// StackFlags say how complete an event's stacks are.
type StackFlags uint16

const (
	PyTruncated     = StackFlags(gpumemGpumemStackFlagGPUMEM_PY_TRUNCATED)     // outermost Python frames dropped
	PyNoThread      = StackFlags(gpumemGpumemStackFlagGPUMEM_PY_NO_THREAD)     // a Python process, but no thread state
	PyReadError     = StackFlags(gpumemGpumemStackFlagGPUMEM_PY_READ_ERROR)    // the frame chain broke
	NativeTruncated = StackFlags(gpumemGpumemStackFlagGPUMEM_NATIVE_TRUNCATED) // outermost native frames dropped
	// GraphPool marks an allocation made for a private pool of PyTorch's
	// allocator (a CUDA graph's): while its thread allocated to the pool,
	// or by a checkpoint restore.
	GraphPool = StackFlags(gpumemGpumemStackFlagGPUMEM_GRAPH_POOL)
)

const (
	headerSize     = int(unsafe.Offsetof(gpumemGpumemEvent{}.Pystack))
	pyFrameSize    = int(unsafe.Sizeof(gpumemGpumemPyframe{}))
	tensorFreeSize = int(unsafe.Sizeof(gpumemGpumemTensorFree{}))
)

// decode reads one ring buffer record: a tensor free (the C struct
// gpumem_tensor_free, told by its size), or the C struct gpumem_event's
// header, then pystack_len Python frames, then ustack_len native frames.
func decode(raw []byte, ev *Event) error {
	if len(raw) == tensorFreeSize {
		decodeTensorFree(raw, ev)
		return nil
	}
	if len(raw) < headerSize {
		return fmt.Errorf("short event: %d bytes, want at least %d", len(raw), headerSize)
	}
	var e gpumemGpumemEvent
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&e)), headerSize), raw)
	stackAt := headerSize + int(e.PystackLen)*pyFrameSize
	if int(e.UstackLen) > len(e.Ustack) || int(e.PystackLen) > len(e.Pystack) || stackAt+int(e.UstackLen)*8 > len(raw) {
		return fmt.Errorf("event claims %d Python and %d native frames in %d bytes", e.PystackLen, e.UstackLen, len(raw))
	}
	*ev = Event{
		Exit:      e.Type == uint16(gpumemGpumemEventTypeGPUMEM_EVENT_EXIT),
		Op:        memory.Op(e.Op),
		Result:    e.Result,
		PID:       e.Proc.Pid,
		TID:       e.Proc.Tid,
		Comm:      unix.ByteSliceToString(unsafe.Slice((*byte)(unsafe.Pointer(&e.Proc.Comm[0])), len(e.Proc.Comm))),
		Address:   e.Address,
		Bytes:     e.Bytes,
		Timestamp: e.Timestamp,
		Device:    e.Device,
		Stack:     ev.Stack[:0],
		PyFrames:  ev.PyFrames[:0],
		Flags:     StackFlags(e.StackFlags),
	}
	if ev.Op.MakesContext() || ev.Op.LoadsModule() { // sent in bytes, which they have none of
		ev.Began, ev.Bytes = e.Bytes, 0
	}
	for i := range int(e.PystackLen) {
		f := (*gpumemGpumemPyframe)(unsafe.Pointer(&raw[headerSize+i*pyFrameSize]))
		ev.PyFrames = append(ev.PyFrames, PyFrame{
			Code: f.Code, Instr: f.Instr, Class: f.Cls,
			Entry: f.Flags&uint32(gpumemGpumemPyframeFlagGPUMEM_PYFRAME_ENTRY) != 0,
		})
	}
	for i := range int(e.UstackLen) {
		ev.Stack = append(ev.Stack, binary.LittleEndian.Uint64(raw[stackAt+i*8:]))
	}
	return nil
}

// decodeTensorFree reads a tensor free's record, which carries no comm: the
// process's is the one its allocations carried.
func decodeTensorFree(raw []byte, ev *Event) {
	f := (*gpumemGpumemTensorFree)(unsafe.Pointer(&raw[0]))
	*ev = Event{
		Op:        memory.OpTensorFree,
		PID:       f.Pid,
		TID:       f.Tid,
		Address:   f.Address,
		Timestamp: f.Timestamp,
		Device:    memory.DeviceUnknown,
		Stack:     ev.Stack[:0],
		PyFrames:  ev.PyFrames[:0],
	}
}

// opOffset is where a record of the C struct gpumem_event holds its op.
const opOffset = unsafe.Offsetof(gpumemGpumemEvent{}.Op)

// opOf is the driver function of a record of the C struct gpumem_event, at
// least headerSize long.
func opOf(raw []byte) memory.Op {
	return memory.Op(binary.LittleEndian.Uint16(raw[opOffset:]))
}
