package tracer

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Event is one driver call, or the exit of a traced process.
type Event struct {
	Exit      bool   // the last thread of process PID exited; only PID, TID, Comm are set
	Op        Op     // the driver function
	Result    int32  // its CUresult
	PID, TID  uint32 //
	Comm      string //
	Address   uint64 // pointer or VMM handle allocated or freed
	Bytes     uint64 // allocated bytes; requested bytes when the call failed
	Timestamp uint64 // ns since boot: an allocation's return, a free's entry
	// Stack holds user return addresses, innermost first, taken when the
	// driver call returned: the first is in the caller of the driver.
	Stack []uint64
}

const stackOffset = int(unsafe.Offsetof(gpumemGpumemEvent{}.Ustack))

// decode reads one ring buffer record. Records are the C struct
// gpumem_event cut after its used stack frames.
func decode(raw []byte, ev *Event) error {
	if len(raw) < stackOffset {
		return fmt.Errorf("short event: %d bytes, want at least %d", len(raw), stackOffset)
	}
	var e gpumemGpumemEvent
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&e)), unsafe.Sizeof(e)), raw)
	if int(e.UstackLen) > len(e.Ustack) || stackOffset+int(e.UstackLen)*8 > len(raw) {
		return fmt.Errorf("event claims %d stack frames in %d bytes", e.UstackLen, len(raw))
	}
	*ev = Event{
		Exit:      e.Type == uint16(gpumemGpumemEventTypeGPUMEM_EVENT_EXIT),
		Op:        Op(e.Op),
		Result:    e.Result,
		PID:       e.Pid,
		TID:       e.Tid,
		Comm:      unix.ByteSliceToString(unsafe.Slice((*byte)(unsafe.Pointer(&e.Comm[0])), len(e.Comm))),
		Address:   e.Address,
		Bytes:     e.Bytes,
		Timestamp: e.Timestamp,
		Stack:     append(ev.Stack[:0], e.Ustack[:e.UstackLen]...),
	}
	return nil
}
