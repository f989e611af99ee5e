package profiler

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/budget"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// TestDriverBudgetSwitchesTheViewOff: a process whose driver allocations
// cost exactly the budget keeps its driver view; one allocation more in a
// window switches it off, said with the numbers: what the view held is
// released implicitly, its calls since are counted and not read, its
// tensor view goes on, and another process is left alone.
func TestDriverBudgetSwitchesTheViewOff(t *testing.T) {
	src := newScript()
	self, parent := os.Getpid(), os.Getppid()                                                 // processes that live: not released as vanished
	budget := budget.Budget{Share: 0.02, PairCost: time.Millisecond, Window: 5 * time.Second} // 100 allocations a window
	scanned := make(chan struct{})
	log := logs.To(func(l logs.Line) {
		t.Log(l.Msg)
		if l.Event == logs.Waiting {
			close(scanned) // the first scan is over: the budget's windows are this test's
		}
	})
	p := newProfiler(Config{ProcRoot: "/proc", PIDs: []int{self, parent}, ScanInterval: time.Hour, DriverBudget: budget, Log: log}, src)
	p.startJobs()
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)
	<-scanned

	alloc := opNamed(t, "cuMemAlloc_v2")
	ts := uint64(0)
	allocate := func(pid, n int, op memory.Op) {
		evs := make([]tracer.Event, n)
		for i := range evs {
			ts++
			evs[i] = tracer.Event{Op: op, PID: uint32(pid), TID: uint32(pid), Comm: "w", Address: 0x10000 + ts*0x1000, Bytes: 4096, Timestamp: ts, Stack: []uint64{0x401000}}
		}
		src.send(evs...)
		if err := p.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Unix(1000, 0)
	allocate(self, 7, alloc)
	allocate(parent, 3, alloc)
	p.updateDriverViews(t0) // begins the windows
	allocate(self, 100, alloc)
	p.updateDriverViews(t0.Add(5 * time.Second))
	if off := p.DriverViewsOff(); len(off) != 0 {
		t.Fatalf("at the budget: %+v", off)
	}
	allocate(self, 101, alloc)
	p.updateDriverViews(t0.Add(10 * time.Second))

	off := p.DriverViewsOff()
	want := "over budget: 20 driver allocations a second at 1ms a driver allocation cost 2.0% of a thread, more than 2.0%"
	if len(off) != 1 || off[0].PID != uint32(self) || off[0].Why != want || p.DriverBudgetExceeded() != 1 {
		t.Fatalf("views off %+v (%d), want pid %d: %q", off, p.DriverBudgetExceeded(), self, want)
	}
	allocate(self, 3, alloc)                // not traced: counted
	allocate(self, 1, memory.OpTensorAlloc) // the tensor view goes on

	s, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	live := map[uint32]map[memory.Kind]uint64{}
	var implicit uint64
	for _, r := range s.Rows() {
		if live[r.PID] == nil {
			live[r.PID] = map[memory.Kind]uint64{}
		}
		live[r.PID][r.Kind] += r.LiveBytes()
		if r.PID == uint32(self) {
			implicit += r.ImplicitFreeBytes
		}
	}
	if live[uint32(self)][memory.KindDevice] != 0 || implicit != 208*4096 || live[uint32(self)][memory.KindTensor] != 4096 {
		t.Errorf("pid %d: live %v, implicitly released %d, want 0 on the device, %d released, 4096 in tensors", self, live[uint32(self)], implicit, 208*4096)
	}
	if live[uint32(parent)][memory.KindDevice] != 3*4096 {
		t.Errorf("pid %d (left alone): live %v, want %d", parent, live[uint32(parent)], 3*4096)
	}
	if len(s.DriverViewsOff) != 1 || s.DriverViewsOff[0].Calls != 3 {
		t.Errorf("snapshot's views off %+v, want pid %d with 3 calls not traced", s.DriverViewsOff, self)
	}
	tot, err := p.Totals()
	if err != nil || len(tot.DriverViewsOff) != 1 || tot.DriverBudgetExceeded != 1 {
		t.Errorf("totals: %+v, %d exceeded (%v)", tot.DriverViewsOff, tot.DriverBudgetExceeded, err)
	}
}
