//go:build fuzzseed

// The seed corpora of tracer's fuzz targets (testdata/fuzz), written by
// go generate -tags fuzzseed (make fuzz-seeds), not by go test.

package tracer

//go:generate go test -tags fuzzseed -run ^TestWriteSeeds$ -count=1 .

import (
	"bytes"
	"encoding/binary"
	"testing"
	"unsafe"

	"github.com/gpu-mem/gpu-mem/internal/fuzzseed"
)

// encodeEvent is the ring buffer record the BPF program writes for e: the
// header, then e.PystackLen Python frames, then e.UstackLen return
// addresses.
func encodeEvent(e *gpumemGpumemEvent) []byte {
	raw := bytes.Clone(unsafe.Slice((*byte)(unsafe.Pointer(e)), headerSize))
	for i := range int(e.PystackLen) {
		raw = append(raw, unsafe.Slice((*byte)(unsafe.Pointer(&e.Pystack[i])), pyFrameSize)...)
	}
	for i := range int(e.UstackLen) {
		raw = binary.LittleEndian.AppendUint64(raw, e.Ustack[i])
	}
	return raw
}

func comm(s string) (c [16]int8) {
	for i := 0; i < len(s) && i < len(c)-1; i++ {
		c[i] = int8(s[i])
	}
	return c
}

// eventSeeds are records as the BPF program writes them: a PyTorch
// allocation with its Python and native frames, a free, a failed
// allocation, a tensor from the USDT probe, a tensor free, an exit, and
// one of each limit (128 Python frames, 127 native ones).
func eventSeeds() []fuzzseed.Seed {
	call := uint16(gpumemGpumemEventTypeGPUMEM_EVENT_CALL)
	alloc := func() *gpumemGpumemEvent {
		e := &gpumemGpumemEvent{Timestamp: 81234567890, Address: 0x7f3a40000000, Bytes: 2 << 20, Type: call,
			Op: uint16(gpumemGpumemOpGPUMEM_OP_MEM_ALLOC), Device: 0}
		e.Proc.Comm, e.Proc.Pid, e.Proc.Tid = comm("python3"), 4242, 4242
		e.Ustack[0], e.Ustack[1], e.Ustack[2], e.Ustack[3] = 0x7f3a5c21b4e1, 0x7f3a5c0a77f2, 0x7f3a4f8c1d03, 0x55d0c3a2b111
		e.UstackLen = 4
		e.Pystack[0] = gpumemGpumemPyframe{Code: 0x7f3a61e2c030, Instr: 0x7f3a61e2c0b6}
		e.Pystack[1] = gpumemGpumemPyframe{Code: 0x7f3a61d11230, Instr: 0x7f3a61d112f0, Flags: uint32(gpumemGpumemPyframeFlagGPUMEM_PYFRAME_ENTRY)}
		e.PystackLen = 2
		return e
	}
	free := alloc()
	free.Op, free.Bytes, free.PystackLen, free.UstackLen = uint16(gpumemGpumemOpGPUMEM_OP_MEM_FREE), 0, 0, 2
	failed := alloc()
	failed.Result, failed.Bytes = 2, 80<<30 // CUDA_ERROR_OUT_OF_MEMORY
	tensor := alloc()
	tensor.Op, tensor.Bytes, tensor.Device = uint16(gpumemGpumemOpGPUMEM_OP_TENSOR_ALLOC), 4096, 1
	exit := &gpumemGpumemEvent{Type: uint16(gpumemGpumemEventTypeGPUMEM_EVENT_EXIT)}
	exit.Proc.Comm, exit.Proc.Pid, exit.Proc.Tid = comm("pt_main_thread"), 4242, 4242
	full := alloc()
	full.StackFlags = uint16(gpumemGpumemStackFlagGPUMEM_PY_TRUNCATED)
	full.Proc.Comm = comm("0123456789abcdef") // no NUL in the kernel's 16 bytes
	full.Proc.Comm[15] = 'f'
	full.PystackLen, full.UstackLen = uint16(len(full.Pystack)), uint32(len(full.Ustack))
	for i := range full.Pystack {
		full.Pystack[i] = gpumemGpumemPyframe{Code: 0x7f0000001000 + uint64(i)*0x100, Instr: 3 * uint64(i), Cls: uint64(i % 2)}
	}
	for i := range full.Ustack {
		full.Ustack[i] = 0x400000 + uint64(i)
	}
	tensorFree := bytes.Clone(unsafe.Slice((*byte)(unsafe.Pointer(&gpumemGpumemTensorFree{
		Timestamp: 81234567990, Address: 0x7f3a40001000, Pid: 4242, Tid: 4243,
	})), tensorFreeSize))
	claims := alloc()
	claims.UstackLen = 127 // more native frames than the record holds
	raw := encodeEvent(claims)
	return []fuzzseed.Seed{
		fuzzseed.Of("alloc", encodeEvent(alloc())),
		fuzzseed.Of("free", encodeEvent(free)),
		fuzzseed.Of("failed", encodeEvent(failed)),
		fuzzseed.Of("tensor", encodeEvent(tensor)),
		fuzzseed.Of("exit", encodeEvent(exit)),
		fuzzseed.Of("full", encodeEvent(full)),
		fuzzseed.Of("claims-more", raw[:len(raw)-8]),
		fuzzseed.Of("short", encodeEvent(alloc())[:headerSize-1]),
		fuzzseed.Of("tensor-free", tensorFree),
	}
}

func TestWriteSeeds(t *testing.T) { fuzzseed.Write(t, "FuzzDecode", eventSeeds()) }
