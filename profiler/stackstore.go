package profiler

import (
	"slices"
	"sync"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/pystack"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// stackStore interns the stacks of allocation events and names them, off
// the event path: a new stack's Python frames at once, on a goroutine of
// their own (readPython), since the process may be gone a moment later;
// its native frames in batches (resolve), at every scan and every
// resolveBatch new stacks, since a large library's symbol table takes a
// while to load. A stack is dropped with its process only (dropProcess):
// an ID the books hold names its stack until the books drop the process.
type stackStore struct {
	sym *symbolize.Symbolizer
	py  *pystack.Resolver
	// pythonGone is called for each exited Python process once the frames
	// of its stacks are read, not before: it stops the walks of it.
	pythonGone func(pid uint32)
	// pythonNoted returns once the Python processes noted so far are
	// registered (the process table's reading job).
	pythonNoted func()

	mu         sync.Mutex
	table      stackTable
	keyBuf     []byte // intern's, reused
	byPID      map[uint32][]accounting.StackID
	frames     frameTable // each distinct frame of named stacks, once
	unresolved []accounting.StackID
	pyUnread   []accounting.StackID // stacks whose Python frames are not read yet
	// python are the Python frames read of stacks not named yet: apart
	// from the raw stacks, which most often have none.
	python   map[*rawStack][]pystack.Frame
	pyExited []uint32 // Python processes to forget once their frames are read
	// The store's jobs: naming native frames (resolve), reading Python
	// frames (readPython).
	resolving, reading *job
}

func newStackStore(sym *symbolize.Symbolizer, py *pystack.Resolver, pythonNoted func(), pythonGone func(uint32), stopped <-chan struct{}) *stackStore {
	s := &stackStore{
		sym:         sym,
		py:          py,
		pythonNoted: pythonNoted,
		pythonGone:  pythonGone,
		table:       newStackTable(),
		byPID:       map[uint32][]accounting.StackID{},
		frames:      newFrameTable(),
		python:      map[*rawStack][]pystack.Frame{},
	}
	s.resolving, s.reading = newJob(s.resolve, stopped), newJob(s.readPython, stopped)
	return s
}

// resolveBatch: every so many new stacks, besides every scan, the resolver
// is asked to name them, so that a burst of new stacks does not hold all of
// its raw frames until the next scan.
const resolveBatch = 1024

// intern returns the ID of the event's stack. It reads nothing: a new
// stack is named by the store's goroutines.
func (s *stackStore) intern(ev *tracer.Event) accounting.StackID {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The key is built in a reused buffer; only a new stack's key is kept,
	// until the stack is named.
	k := stackKey(s.keyBuf[:0], ev)
	s.keyBuf = k
	id, check, found := s.table.lookup(k)
	if found {
		return id
	}
	raw := &rawStack{key: string(k), op: ev.Op}
	s.table.add(id, check, raw)
	s.byPID[ev.PID] = append(s.byPID[ev.PID], id)
	s.unresolved = append(s.unresolved, id)
	if len(ev.PyFrames) > 0 {
		s.pyUnread = append(s.pyUnread, id)
		s.reading.ask()
	}
	if len(s.unresolved)%resolveBatch == 0 {
		s.resolving.ask()
	}
	return id
}

// pythonExited has an exited Python process forgotten once the frames of
// its stacks are read.
func (s *stackStore) pythonExited(pid uint32) {
	s.mu.Lock()
	s.pyExited = append(s.pyExited, pid)
	s.mu.Unlock()
	s.reading.ask()
}

// readPython names the Python frames of the stacks interned since it last
// ran, from their processes' memory, then forgets the Python processes
// that exited meanwhile: the job s.reading. The memory is read without
// s.mu: events keep flowing.
func (s *stackStore) readPython() {
	s.mu.Lock()
	ids, exited := s.pyUnread, s.pyExited
	s.pyUnread, s.pyExited = nil, nil
	raws := make([]*rawStack, 0, len(ids))
	for _, id := range ids {
		raws = append(raws, s.table.m[id].raw)
	}
	s.mu.Unlock()
	for _, r := range raws {
		if r != nil && !s.py.Has(r.pid()) {
			// Frames of a process not registered yet: replayed from a
			// previous agent's journal, read before the scan that
			// registers it. Its event asked for it first.
			s.pythonNoted()
			break
		}
	}
	named := make([][]pystack.Frame, len(raws))
	for i, r := range raws {
		if r != nil {
			named[i] = s.py.Frames(r.pid(), r.pyFrames())
		}
	}
	s.mu.Lock()
	for i, r := range raws {
		if r != nil && s.table.m[ids[i]].raw == r { // not dropped meanwhile
			s.python[r] = named[i]
		}
	}
	s.mu.Unlock()
	for _, pid := range exited {
		s.py.Forget(pid)
		s.pythonGone(pid)
	}
}

// resolve names the native frames of the stacks interned since it last
// ran, and drops their raw frames: the job s.resolving. The symbol tables
// are read without s.mu, so that events keep flowing.
func (s *stackStore) resolve() {
	s.mu.Lock()
	todo := s.unresolved
	s.unresolved = nil
	taken := time.Now() // every stack of todo was taken before
	s.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	s.reading.await() // every stack of todo has its Python frames read after
	// In batches: a batch's frames are copies until interned.
	const batch = resolveBatch
	raws := make([]*rawStack, 0, min(batch, len(todo)))
	python := make([][]pystack.Frame, 0, cap(raws))
	named := make([][]symbolize.Frame, 0, cap(raws))
	for len(todo) > 0 {
		ids := todo[:min(batch, len(todo))]
		todo = todo[len(ids):]
		raws, python, named = raws[:0], python[:0], named[:0]
		s.mu.Lock()
		for _, id := range ids {
			r := s.table.m[id].raw
			raws, python = append(raws, r), append(python, s.python[r])
		}
		s.mu.Unlock()
		for i, r := range raws {
			var frames []symbolize.Frame
			if r != nil {
				frames = pystack.Merge(s.sym.FramesTaken(r.pid(), r.native(), taken), python[i])
			}
			named = append(named, frames)
		}
		s.storeFrames(ids, raws, named)
	}
}

// askResolving has the stacks taken since the last naming named, if there
// are any: an idle agent's scans wake no job.
func (s *stackStore) askResolving() {
	s.mu.Lock()
	pending := len(s.unresolved) > 0
	s.mu.Unlock()
	if pending {
		s.resolving.ask()
	}
}

// storeFrames keeps the named frames of stacks, unless a stack was dropped
// (and its ID perhaps taken again) while they were read.
func (s *stackStore) storeFrames(ids []accounting.StackID, raws []*rawStack, named [][]symbolize.Frame) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, id := range ids {
		if st, ok := s.table.m[id]; ok && raws[i] != nil && st.raw == raws[i] {
			st.frames = s.internFrames(st.raw, named[i])
			delete(s.python, st.raw)
			st.raw = nil // named now
			s.table.m[id] = st
		}
	}
}

// internFrames returns the stack's frames, after its innermost ones
// (innerFrames), in the frame table, referenced until the stack is dropped.
func (s *stackStore) internFrames(raw *rawStack, frames []symbolize.Frame) []uint32 {
	inner := innerFrames(raw, frames)
	out := make([]uint32, 0, len(inner)+len(frames))
	for _, f := range inner {
		out = append(out, s.frames.intern(f))
	}
	for _, f := range frames {
		out = append(out, s.frames.intern(f))
	}
	if t := raw.thread(); t != "" {
		out = append(out, s.frames.intern(threadFrame(t)))
	}
	return out
}

// threadFrame is the outermost frame of a stack made on a thread of its
// own (rawStack.thread): the thread's name, as memory.ThreadFrame writes it.
func threadFrame(name string) symbolize.Frame {
	return symbolize.Frame{Function: memory.ThreadFrame(name)}
}

// graphPoolFrame marks the stacks of allocations made for a CUDA graph's
// pool (memory.GraphPool).
var graphPoolFrame = symbolize.Frame{Function: memory.GraphPool}

// innerFrames are the frames a stack ends in, innermost first: the graph
// pool's mark when it was made for one, then the driver function's. named
// are its frames named (nil before).
func innerFrames(raw *rawStack, named []symbolize.Frame) []symbolize.Frame {
	driver := symbolize.Frame{Function: raw.op.Symbol(), Module: "libcuda.so.1"}
	if raw.graphPool() && madeByAllocator(raw, named) {
		return []symbolize.Frame{graphPoolFrame, driver}
	}
	return []symbolize.Frame{driver}
}

// madeByAllocator says whether PyTorch's allocator made a stack's
// allocation: a tensor, or a driver call with a frame of the allocator's
// (memory.InAllocator). What else a thread allocating to a pool calls the
// driver for (cuBLAS's and cuDNN's own memory, the modules they load) is
// not the pool's. Before the stack is named, only its tensors are known to
// be.
func madeByAllocator(raw *rawStack, named []symbolize.Frame) bool {
	return raw.op.Kind() == memory.KindTensor || slices.ContainsFunc(named, func(f symbolize.Frame) bool {
		return memory.InAllocator(f.Function)
	})
}

// stackFrames are a stack's frames; before it is named, its driver
// function and the Python frames read so far.
func (s *stackStore) stackFrames(id accounting.StackID) []*symbolize.Frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.framesLocked(id)
}

// framesLocked is stackFrames for a caller holding s.mu.
func (s *stackStore) framesLocked(id accounting.StackID) []*symbolize.Frame {
	st := s.table.m[id]
	if st.raw != nil {
		return s.unnamedFrames(st.raw)
	}
	frames := make([]*symbolize.Frame, len(st.frames))
	for i, f := range st.frames {
		frames[i] = s.frames.frames[f]
	}
	return frames
}

// unnamedFrames are what is known of the frames of a stack not named yet:
// its innermost frames and the Python frames read so far. No reference is
// taken on them. The caller holds s.mu.
func (s *stackStore) unnamedFrames(raw *rawStack) []*symbolize.Frame {
	var frames []*symbolize.Frame
	for _, f := range innerFrames(raw, nil) {
		frames = append(frames, s.frames.find(f))
	}
	for _, f := range pystack.Merge(nil, s.python[raw]) {
		frames = append(frames, s.frames.find(f))
	}
	if t := raw.thread(); t != "" {
		frames = append(frames, s.frames.find(threadFrame(t)))
	}
	return frames
}

// nameRows sets the frames of the entries whose stacks are named (indices
// in table), and returns the table, copied into table, and the entries
// left without frames: their stacks are not named yet. A chunk of entries
// at a time: events wait for the lock no longer than that. Indices are
// freed only as processes are dropped, never while a snapshot is named
// (Profiler.naming): the table copied last has every index of every chunk.
func (s *stackStore) nameRows(entries []snapshot.Entry, table []*symbolize.Frame) ([]*symbolize.Frame, []int) {
	var unnamed []int
	const chunk = 4096
	for done := 0; done < len(entries); done += chunk {
		s.mu.Lock()
		for i := range entries[done:min(done+chunk, len(entries))] {
			e := &entries[done+i]
			if e.Frames = s.table.m[e.Stack].frames; e.Frames == nil {
				unnamed = append(unnamed, done+i)
			}
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.frames.appendPointers(table), unnamed
}

// nameRowsSoFar is nameRows, the entries left without frames given what is
// known of their stacks now (stackFrames), appended to the table: a run's
// snapshot shows every row.
func (s *stackStore) nameRowsSoFar(entries []snapshot.Entry, table []*symbolize.Frame) []*symbolize.Frame {
	table, unnamed := s.nameRows(entries, table)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, at := range unnamed {
		e := &entries[at]
		frames := s.framesLocked(e.Stack)
		e.Frames = make([]uint32, len(frames))
		for j, f := range frames {
			e.Frames[j] = uint32(len(table))
			table = append(table, f)
		}
	}
	return table
}

// allNamed says whether the stacks of every peak's rows are named.
func (s *stackStore) allNamed(peaks []accounting.Peak) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pk := range peaks {
		for _, r := range pk.Rows {
			if !s.table.m[r.Stack].named() {
				return false
			}
		}
	}
	return true
}

// naming says whether a process has stacks not yet named.
func (s *stackStore) naming(pid uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range s.byPID[pid] {
		if !s.table.m[id].named() {
			return true
		}
	}
	return false
}

// dropProcess forgets the stacks of a dropped process. Snapshots taken
// before keep their frames.
func (s *stackStore) dropProcess(pid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range s.byPID[pid] {
		st := s.table.m[id]
		s.frames.release(st.frames)
		delete(s.python, st.raw)
		s.table.drop(id)
	}
	delete(s.byPID, pid)
}

// addPIDs adds the processes with stacks to set.
func (s *stackStore) addPIDs(set map[uint32]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	addKeys(set, s.byPID)
}
