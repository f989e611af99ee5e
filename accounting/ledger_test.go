package accounting

import (
	"maps"
	"testing"

	"github.com/gpu-mem/gpu-mem/memory"
)

var (
	weights = Key{PID: 10, Stack: 1, Kind: memory.KindDevice}
	cache   = Key{PID: 10, Stack: 2, Kind: memory.KindDevice}
	other   = Key{PID: 11, Stack: 1, Kind: memory.KindDevice}
)

func TestFreeReleasesWhatItsAllocationCharged(t *testing.T) {
	l := New()
	l.Alloc(weights, 0x1000, memory.SpacePointer, 100, 1)
	l.Alloc(weights, 0x2000, memory.SpacePointer, 200, 2)
	l.Alloc(cache, 0x3000, memory.SpacePointer, 300, 3)
	l.Free(10, cuMemFree, 0x2000, 4)
	l.Free(10, cuMemFree, 0x3000, 5)

	s := l.Snapshot()
	if got, want := s.Rows[weights], (Counters{AllocBytes: 300, AllocCount: 2, FreeBytes: 200, FreeCount: 1}); got != want {
		t.Errorf("weights %+v, want %+v", got, want)
	}
	if got := s.Rows[cache]; got.LiveBytes() != 0 || got.LiveCount() != 0 {
		t.Errorf("cache %+v", got)
	}
}

func TestHandlesAndPointersAreApart(t *testing.T) {
	l := New()
	vmm := Key{PID: 10, Stack: 3, Kind: memory.KindVMM}
	l.Alloc(vmm, 0x1000, memory.SpaceHandle, 64, 1)
	l.Alloc(weights, 0x1000, memory.SpacePointer, 32, 2)
	l.Free(10, cuMemRelease, 0x1000, 3)
	s := l.Snapshot()
	if s.Rows[vmm].LiveBytes() != 0 || s.Rows[weights].LiveBytes() != 32 || s.Stats.UnknownFrees != 0 {
		t.Errorf("%+v", s)
	}
}

func TestUnknownFrees(t *testing.T) {
	l := New()
	l.Free(10, cuMemFree, 0x1000, 1) // process never seen
	l.Alloc(weights, 0x2000, memory.SpacePointer, 8, 2)
	l.Free(10, cuMemFree, 0x3000, 3) // pointer never seen
	l.Free(10, cuMemRelease, 0x4000, 4)
	s := l.Snapshot().Stats
	want := map[string]uint64{"cuMemFree_v2": 2, "cuMemRelease": 1}
	if s.UnknownFrees != 3 || !maps.Equal(s.UnknownFreesBy, want) {
		t.Errorf("unknown frees %d by %v, want 3 by %v", s.UnknownFrees, s.UnknownFreesBy, want)
	}
}

// A free of pointer P on one thread races with another thread getting P back
// from the driver: the new allocation's event arrives first. The free,
// stamped before the reuse, releases the old allocation.
func TestFreeRacingWithReuse(t *testing.T) {
	l := New()
	l.Alloc(weights, 0x1000, memory.SpacePointer, 100, 1)
	l.Alloc(cache, 0x1000, memory.SpacePointer, 300, 5) // returned at 5
	l.Free(10, cuMemFree, 0x1000, 4)                    // entered at 4
	s := l.Snapshot()
	if s.Rows[weights].LiveBytes() != 0 || s.Rows[cache].LiveBytes() != 300 || s.Stats.UnknownFrees != 0 {
		t.Errorf("%+v", s)
	}
	l.Free(10, cuMemFree, 0x1000, 6)
	if s := l.Snapshot(); s.Rows[cache].LiveBytes() != 0 {
		t.Errorf("%+v", s)
	}
}

// A pointer allocated before the tracer attached is freed and handed out
// again, and the new allocation's event arrives first: the free is unknown.
func TestFreeOfUnseenAllocationBeforeReuse(t *testing.T) {
	l := New()
	l.Alloc(weights, 0x1000, memory.SpacePointer, 100, 5)
	l.Free(10, cuMemFree, 0x1000, 4)
	s := l.Snapshot()
	if s.Rows[weights].LiveBytes() != 100 || s.Stats.UnknownFrees != 1 {
		t.Errorf("%+v", s)
	}
}

func TestExitReleasesImplicitly(t *testing.T) {
	l := New()
	l.Alloc(weights, 0x1000, memory.SpacePointer, 100, 1)
	l.Alloc(weights, 0x2000, memory.SpacePointer, 50, 2)
	l.Alloc(other, 0x1000, memory.SpacePointer, 7, 3)
	l.Free(10, cuMemFree, 0x2000, 4)
	l.Exit(10, 5)
	s := l.Snapshot()
	want := Counters{AllocBytes: 150, AllocCount: 2, FreeBytes: 50, FreeCount: 1, ImplicitFreeBytes: 100, ImplicitFreeCount: 1}
	if s.Rows[weights] != want || s.Rows[weights].LiveBytes() != 0 {
		t.Errorf("after exit %+v, want %+v", s.Rows[weights], want)
	}
	if s.Rows[other].LiveBytes() != 7 || s.Stats.ProcessExits != 1 {
		t.Errorf("other process touched: %+v", s)
	}
	if pids := l.LivePIDs(); len(pids) != 1 || pids[0] != 11 {
		t.Errorf("live pids %v", pids)
	}
}

func TestFailuresAreNotAllocations(t *testing.T) {
	l := New()
	l.Fail(weights, 1, memory.CUDAOutOfMemory, 1<<40)
	l.Fail(weights, 1, memory.CUDAOutOfMemory, 1<<40)
	s := l.Snapshot()
	if len(s.Rows) != 0 {
		t.Errorf("rows %+v", s.Rows)
	}
	f := s.Failures[FailureKey{Key: weights, Op: 1, Result: 2}]
	if f.Count != 2 || f.Bytes != 2<<40 {
		t.Errorf("failures %+v stats %+v", s.Failures, s.Stats)
	}
}

func TestDropExited(t *testing.T) {
	l := New()
	l.Alloc(weights, 0x1000, memory.SpacePointer, 100, 1)
	l.Alloc(other, 0x1000, memory.SpacePointer, 7, 2)
	l.Fail(other, 1, memory.CUDAOutOfMemory, 9)
	// A live process whose only calls failed is not dropped.
	failedOnly := Key{PID: 12, Stack: 1, Kind: memory.KindDevice}
	l.Fail(failedOnly, 1, memory.CUDAOutOfMemory, 9)
	l.Exit(11, 3)
	// A process kept (its last numbers not yet exported) stays until a
	// later call.
	if dropped := l.DropExited(func(pid uint32) bool { return pid == 11 }); len(dropped) != 0 || len(l.Snapshot().Rows) != 2 {
		t.Errorf("dropped %v while kept, books %+v", dropped, l.Snapshot())
	}
	dropped := l.DropExited(func(uint32) bool { return false })
	s := l.Snapshot()
	if len(dropped) != 1 || !dropped[11] || len(s.Rows) != 1 || len(s.Failures) != 1 || s.Rows[weights].LiveBytes() != 100 {
		t.Errorf("dropped %v, books %+v", dropped, s)
	}
}

// TestRetainedHandle: a VMM handle retained once takes two releases, as
// NCCL frees its buffers; the first leaves it live.
func TestRetainedHandle(t *testing.T) {
	l := New()
	k := Key{PID: 1, Stack: 3, Kind: memory.KindVMM}
	l.Alloc(k, 0x10, memory.SpaceHandle, 4096, 1)
	l.Retain(1, 0x10)
	l.Free(1, cuMemRelease, 0x10, 2)
	if live := l.Snapshot().Rows[k].LiveBytes(); live != 4096 {
		t.Errorf("after one release of two: %d live, want 4096", live)
	}
	l.Free(1, cuMemRelease, 0x10, 3)
	s := l.Snapshot()
	if s.Rows[k].LiveBytes() != 0 || s.Rows[k].FreeCount != 1 || s.Stats.UnknownFrees != 0 {
		t.Errorf("after both releases: %+v, stats %+v", s.Rows[k], s.Stats)
	}
	l.Retain(1, 0x20) // never seen created: left alone
	l.Free(1, cuMemRelease, 0x20, 4)
	if got := l.Snapshot().Stats.UnknownFrees; got != 1 {
		t.Errorf("unknown frees %d, want 1", got)
	}
}

var cuMemFree, cuMemRelease = opNamed("cuMemFree_v2"), opNamed("cuMemRelease")

func opNamed(symbol string) memory.Op {
	for op := range memory.Op(64) {
		if op.Symbol() == symbol {
			return op
		}
	}
	panic("no driver function " + symbol)
}
