package tracer

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"
	"unsafe"

	"github.com/gpu-mem/gpu-mem/memory"
)

// FuzzDecode: any ring buffer record decodes or is refused, never read
// past its end; what decodes is what the record says, whatever the event
// decoded into held before.
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		var ev Event
		err := decode(raw, &ev)
		if len(raw) == tensorFreeSize {
			f := (*gpumemGpumemTensorFree)(unsafe.Pointer(&raw[0]))
			if err != nil || ev.Op != memory.OpTensorFree || ev.PID != f.Pid || ev.TID != f.Tid || ev.Address != f.Address || ev.Timestamp != f.Timestamp || len(ev.Stack)+len(ev.PyFrames) != 0 {
				t.Fatalf("a tensor free's record decoded as %+v, %v", ev, err)
			}
			return
		}
		if len(raw) < headerSize {
			if err == nil {
				t.Fatalf("a %d-byte record decoded", len(raw))
			}
			return
		}
		var e gpumemGpumemEvent
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&e)), headerSize), raw)
		if err != nil {
			return
		}
		if len(ev.PyFrames) != int(e.PystackLen) || len(ev.Stack) != int(e.UstackLen) {
			t.Fatalf("%d Python and %d native frames, the record says %d and %d", len(ev.PyFrames), len(ev.Stack), e.PystackLen, e.UstackLen)
		}
		if len(ev.Comm) > len(e.Proc.Comm) || bytes.IndexByte([]byte(ev.Comm), 0) >= 0 {
			t.Fatalf("comm %q", ev.Comm)
		}
		stackAt := headerSize + int(e.PystackLen)*pyFrameSize
		for i, pc := range ev.Stack {
			if want := binary.LittleEndian.Uint64(raw[stackAt+8*i:]); pc != want {
				t.Fatalf("frame %d: %#x, record %#x", i, pc, want)
			}
		}
		// Decoding into an event that held a longer stack gives the same.
		reused := Event{Stack: make([]uint64, 200), PyFrames: make([]PyFrame, 200)}
		for i := range reused.Stack {
			reused.Stack[i] = ^uint64(0)
		}
		if err := decode(raw, &reused); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(reused.Stack, ev.Stack) || !slices.Equal(reused.PyFrames, ev.PyFrames) || reused.Comm != ev.Comm {
			t.Fatalf("decoded into a used event: %+v, fresh %+v", reused, ev)
		}
		_, _, _ = ev.Op.Symbol(), ev.Op.Kind(), ev.Op.IsFree()
	})
}
