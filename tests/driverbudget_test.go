package tests

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/budget"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/metrics"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// TestDriverBudget: a process whose driver calls cost it more than the
// driver view's budget has its driver view switched off, said once with
// the numbers: from then on its calls are counted in BPF, not traced, so
// that every call is either in the books or counted, exactly; what the view
// held is released implicitly; every output says so; another process is
// left alone.
func TestDriverBudget(t *testing.T) {
	busy := startWorkload(t, nil, simwork, "threads", "1", "2", "400")
	calm := startWorkload(t, nil, simwork, "kinds")
	// 400 allocations a second at 1 ms each: 40% of a thread, over 2%.
	budget := budget.Budget{Share: 0.02, PairCost: time.Millisecond, Window: 300 * time.Millisecond}
	s := startProfiler(t, profiler.Config{Library: simLib, Tensors: profiler.TensorsOff, DriverBudget: budget, ScanInterval: 50 * time.Millisecond}, busy, calm)
	expect := busy.run()
	calm.run()
	said := s.waitLog(fmt.Sprintf("pid %d: driver view off: over budget: ", busy.pid))
	r := s.report()

	if len(r.DriverViewsOff) != 1 || r.DriverViewsOff[0].PID != uint32(busy.pid) {
		t.Fatalf("driver views off %+v, want pid %d's", r.DriverViewsOff, busy.pid)
	}
	off := r.DriverViewsOff[0]
	if !strings.HasSuffix(said, off.Why) {
		t.Errorf("said %q, the view says %q", said, off.Why)
	}
	var traced, implicit, freed uint64
	for _, row := range r.Rows() {
		if row.PID != uint32(busy.pid) {
			continue
		}
		if row.Kind != memory.KindDevice || row.LiveBytes() != 0 {
			t.Errorf("pid %d's row %+v: nothing live once its driver view is off", busy.pid, row)
		}
		traced += row.AllocCount
		freed += row.FreeCount
		implicit += row.ImplicitFreeCount
	}
	if traced == 0 || traced == expect["allocs"] || implicit != traced-freed {
		t.Errorf("traced %d allocations (of %d), %d freed, %d released implicitly", traced, expect["allocs"], freed, implicit)
	}
	if calls := expect["allocs"] + expect["frees"]; traced+freed+off.Calls != calls {
		t.Errorf("%d traced allocations + %d traced frees + %d calls not traced = %d, want the workload's %d calls",
			traced, freed, off.Calls, traced+freed+off.Calls, calls)
	}
	var calmLive uint64
	for _, row := range r.Rows() {
		if row.PID == uint32(calm.pid) {
			calmLive += row.LiveBytes()
		}
	}
	// kinds' live bytes at its end (TestAgentStartedBeforeTheWorkload's).
	if want := uint64(2<<20 + 30720 + 2<<20 + 4096 + 65536 + 131072 + 4<<20); calmLive != want {
		t.Errorf("the calm process holds %d bytes, want %d: its driver view is left alone", calmLive, want)
	}
	checkDriverOffSaid(t, s, r, off)
	busy.exit()
	calm.exit()
}

// checkDriverOffSaid checks that JSON, top, pprof and the metrics say that
// view is off, since when and with how many calls.
func checkDriverOffSaid(t *testing.T, s *session, r *snapshot.Snapshot, view snapshot.DriverViewOff) {
	t.Helper()
	checkOutputsSay[snapshot.DriverViewOff](t, r, view.String(), "driver_views_off", `"driver_off":`)
	families := gather(t, s)
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			for _, l := range m.GetLabel() {
				if l.GetName() == "pid" && l.GetValue() != strconv.Itoa(int(view.PID)) {
					v = -1
				}
			}
			if v >= 0 {
				got[f.GetName()] += v
			}
		}
	}
	want := map[string]float64{
		metrics.DriverViewOffSinceName:   float64(view.Ended.UnixNano()) / 1e9,
		metrics.DriverCallsNotTracedName: float64(view.Calls),
		metrics.DriverBudgetExceededName: 1,
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s %v, want %v", name, got[name], w)
		}
	}
}
