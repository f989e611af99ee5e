package profiler

import (
	"encoding/binary"
	"hash/maphash"
	"unsafe"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// stackTable holds the interned stacks by ID: a 64-bit hash of the stack's
// key (the process, the driver function and the raw frames: the native
// addresses and the Python frames' code and instruction pointers).
//
// A stack keeps its raw frames only until its native frames are named;
// then what stays is the named frames (indices in the frame table) and a
// check: a second 64-bit hash of the key with another seed. Two stacks
// with the same ID are told apart by the check for as long as they live,
// and by the raw key too while it is kept; the second takes the next free
// ID. Two distinct stacks are taken for one only if both hashes collide:
// for n stacks, odds of about n*n/2^129 (1e-26 for a million).
type stackTable struct {
	m     map[accounting.StackID]stack
	seeds [2]maphash.Seed // of the ID and of the check
	hash  func(maphash.Seed, []byte) uint64
}

// stack is one interned call stack of one process. Its Python frames are
// named as soon as it is seen, while the process lives to be read; its
// native frames soon after (the symbol tables of a library such as
// libtorch_cuda take seconds to load); both off the event path.
type stack struct {
	check uint64
	raw   *rawStack // nil once named
	// frames are indices in the frame table, innermost first: the driver
	// function, then its callers; nil until named, never changed after.
	frames []uint32
}

// gone says the stack's process was dropped: the entry is a mark, kept
// only to continue a run of colliding IDs.
func (s stack) gone() bool { return s.raw == nil && s.frames == nil }

// named says whether the stack's native frames are named, or it is gone:
// not waiting for the symbolizer.
func (s stack) named() bool { return s.raw == nil }

// rawStack is a stack as its first event carried it, kept until named.
type rawStack struct {
	key string // what the ID hashes
	op  memory.Op
}

func newStackTable() stackTable {
	return stackTable{
		m:     map[accounting.StackID]stack{},
		seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		hash:  maphash.Bytes,
	}
}

// lookup finds the stack with this key: its ID if found, else the ID and
// check to add it with.
func (t *stackTable) lookup(key []byte) (id accounting.StackID, check uint64, found bool) {
	id = accounting.StackID(t.hash(t.seeds[0], key))
	check = t.hash(t.seeds[1], key)
	for ; ; id++ {
		if id == 0 {
			continue // 0 is no stack: the sum over stacks (Totals)
		}
		s, ok := t.m[id]
		if !ok {
			return id, check, false
		}
		if !s.gone() && s.check == check && (s.raw == nil || s.raw.key == string(key)) {
			return id, check, true
		}
	}
}

// add interns a stack where lookup did not find it.
func (t *stackTable) add(id accounting.StackID, check uint64, raw *rawStack) {
	t.m[id] = stack{check: check, raw: raw}
}

// drop forgets a stack. Where the next ID is taken, it may be a stack that
// collided with this one: a mark stays so that lookup still finds it.
func (t *stackTable) drop(id accounting.StackID) {
	if _, next := t.m[id+1]; next {
		t.m[id] = stack{} // gone
		return
	}
	delete(t.m, id)
	for id--; ; id-- { // marks that no longer continue a run
		if s, ok := t.m[id]; !ok || !s.gone() {
			return
		}
		delete(t.m, id)
	}
}

// stackKey appends the key of an event's stack to buf: its process,
// driver function, native frame count, its marks, native addresses, then
// its Python frames or its thread's name. The same stack allocating for a
// graph's pool and outside one is two stacks: the pool's names it. A stack
// without Python frames made on a thread other than the process's first
// is told by its thread's name (threadName): PyTorch's autograd threads,
// which make a backward pass's tensors, have no Python frames to say so.
func stackKey(buf []byte, ev *tracer.Event) []byte {
	k := binary.LittleEndian.AppendUint32(buf, ev.PID)
	k = binary.LittleEndian.AppendUint16(k, uint16(ev.Op))
	k = binary.LittleEndian.AppendUint16(k, uint16(len(ev.Stack)))
	thread := threadName(ev)
	var marks byte
	if ev.Flags&tracer.GraphPool != 0 {
		marks |= markGraphPool
	}
	if thread != "" {
		marks |= markThread
	}
	k = append(k, marks)
	k = append(k, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(ev.Stack))), len(ev.Stack)*8)...)
	if thread != "" {
		return append(k, thread...)
	}
	return append(k, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(ev.PyFrames))), len(ev.PyFrames)*int(unsafe.Sizeof(tracer.PyFrame{})))...)
}

// threadName is the name of the thread that made a stack without Python
// frames, if it is not the process's first thread and its event carried
// its name; else "".
func threadName(ev *tracer.Event) string {
	if len(ev.PyFrames) > 0 || ev.TID == ev.PID {
		return ""
	}
	return ev.Comm
}

// keyHeader is the size of a key's process, driver function, native frame
// count and marks, before its frames.
const keyHeader = 9

// A key's marks.
const (
	markGraphPool = 1 << iota // made for a CUDA graph's pool
	markThread                // the thread's name follows the native frames
)

// graphPool says whether a raw stack was made for a CUDA graph's pool.
func (r *rawStack) graphPool() bool { return r.key[8]&markGraphPool != 0 }

// thread is the name of the thread that made a raw stack, if its key has
// it (stackKey).
func (r *rawStack) thread() string {
	if r.key[8]&markThread == 0 {
		return ""
	}
	return r.key[keyHeader+8*r.nativeLen():]
}

// pid is the process of a raw stack.
func (r *rawStack) pid() uint32 { return binary.LittleEndian.Uint32([]byte(r.key[:4])) }

// native are the raw stack's native addresses, read from its key.
func (r *rawStack) native() []uint64 {
	out := make([]uint64, r.nativeLen())
	for i := range out {
		out[i] = binary.LittleEndian.Uint64([]byte(r.key[keyHeader+8*i : keyHeader+8+8*i]))
	}
	return out
}

func (r *rawStack) nativeLen() int { return int(binary.LittleEndian.Uint16([]byte(r.key[6:8]))) }

// pyFrames are the raw stack's Python frames as the event carried them,
// read from its key.
func (r *rawStack) pyFrames() []tracer.PyFrame {
	const size = int(unsafe.Sizeof(tracer.PyFrame{}))
	if r.thread() != "" {
		return nil
	}
	data := r.key[keyHeader+8*r.nativeLen():]
	out := make([]tracer.PyFrame, len(data)/size)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(out))), len(out)*size), data)
	return out
}
