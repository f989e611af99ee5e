package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/pprof/profile"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/control/controltest"
	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/metrics"
	"github.com/gpu-mem/gpu-mem/pprof"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/pyroscope"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/report"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// startLate starts simwork.py's tensor_late scenario under python and
// lets it run its early tensors; the caller goes on with w.run().
func startLate(t *testing.T, python string) *workload {
	t.Helper()
	w := startWorkload(t, []string{"SIMCUDA_LIB=" + simLib, "SIMTORCH_LIB=" + repoRoot + "/build/sim/libc10_cuda.so"},
		python, repoRoot+"/tests/workloads/simwork.py", "tensor_late")
	return w
}

// early runs the workload's tensors made before any tensor view.
func (w *workload) early() {
	w.t.Helper()
	fmt.Fprintln(w.stdin)
	if line := w.line(); line != "early" {
		w.t.Fatalf("workload said %q, want early", line)
	}
}

// TestTensorViewOnDemand: with the tensor view on demand, a process switched
// on mid-run has its tensors from then on charged exactly, its frees of
// tensors made before counted apart (neither unknown nor subtracted), and
// every output says from when its view holds; a process not switched on
// has no probe hit at all (the program's run count); switched off, the
// view's books close: what it held is released implicitly.
func TestTensorViewOnDemand(t *testing.T) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatalf("enable BPF stats: %v", err)
	}
	defer stats.Close()
	python := pythons(t)[2]
	on, off := startLate(t, python), startLate(t, python)
	s := startProfiler(t, profiler.Config{Library: simLib, Tensors: profiler.TensorsOnDemand}, on, off)
	s.waitEvent(logs.Python, "pid", on.pid)
	s.waitEvent(logs.Python, "pid", off.pid)
	on.early()
	off.early()
	if err := s.p.SetTensors(on.pid, snapshot.TensorAsk{By: snapshot.ByControl}); err != nil {
		t.Fatal(err)
	}
	profilerViews := func() ([]snapshot.TensorView, error) { return s.p.TensorViews(), nil }
	controltest.WaitView(t, profilerViews, on.pid, "tensor view on", hangLimit, func(v snapshot.TensorView) bool { return !v.Since.IsZero() })
	runs := func() uint64 {
		n, _, err := s.p.TensorProbeStats()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := runs()

	off.run()
	if got := runs(); got != before {
		t.Errorf("a process not switched on hit the tensor probes %d times", got-before)
	}
	expect := on.run()
	// 3 allocations, the scratch's free and the two early tensors' frees.
	if got := runs(); got != before+6 {
		t.Errorf("the tensor probes ran %d times for the process switched on, want 6", got-before)
	}

	r := s.report()
	tensors := byPythonFunction(r, on.pid, memory.KindTensor)
	const MiB = 1 << 20
	for fn, want := range map[string]accounting.Counters{
		"late_activations": {AllocBytes: expect["tensor_late_activations"], AllocCount: 2},
		"late_scratch":     {AllocBytes: 3 * MiB, AllocCount: 1, FreeBytes: 3 * MiB, FreeCount: 1},
	} {
		if got := tensors[fn].Counters; got != want {
			t.Errorf("%s: %+v, want %+v", fn, got, want)
		}
	}
	if len(tensors) != 2 {
		t.Errorf("tensor rows by function %v: the tensors made before the view are charged", keys(tensors))
	}
	if len(byPythonFunction(r, off.pid, memory.KindTensor)) != 0 {
		t.Error("the process not switched on has tensor rows")
	}
	if r.Ledger.FreesBeforeView != expect["frees_before_view"] || r.Ledger.UnknownFrees != 0 {
		t.Errorf("frees before the view %d (want %d), unknown frees %d (want 0)", r.Ledger.FreesBeforeView, expect["frees_before_view"], r.Ledger.UnknownFrees)
	}
	if len(r.TensorViews) != 1 || r.TensorViews[0].PID != uint32(on.pid) || r.TensorViews[0].Since.IsZero() || !r.TensorViews[0].Ended.IsZero() {
		t.Fatalf("tensor views %+v", r.TensorViews)
	}
	view := r.TensorViews[0]
	checkTensorViewSaid(t, s, r, view)

	if err := s.p.StopTensors(on.pid); err != nil {
		t.Fatal(err)
	}
	if err := s.p.StopTensors(on.pid); err == nil {
		t.Error("a view switched off twice")
	}
	r = s.report()
	live := byPythonFunction(r, on.pid, memory.KindTensor)["late_activations"]
	if live.LiveBytes() != 0 || live.ImplicitFreeBytes != expect["tensor_late_activations"] {
		t.Errorf("switched off, late_activations: %+v, want its %d bytes released implicitly", live.Counters, expect["tensor_late_activations"])
	}
	if v := r.TensorViews[0]; v.Ended.IsZero() || v.Why != "switched off" {
		t.Errorf("switched off: %+v", v)
	}
	on.exit()
	off.exit()
}

// checkTensorViewSaid checks that every output says from when view holds.
func checkTensorViewSaid(t *testing.T, s *session, r *snapshot.Snapshot, view snapshot.TensorView) {
	t.Helper()
	checkOutputsSay[snapshot.TensorView](t, r, view.String(), "tensor_views", `"tensors_since":`)
	families := gather(t, s)
	var since float64
	for _, f := range families {
		if f.GetName() == metrics.TensorViewSinceName && len(f.GetMetric()) == 1 {
			since = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if want := float64(view.Since.UnixNano()) / 1e9; since != want {
		t.Errorf("%s %v, want %v", metrics.TensorViewSinceName, since, want)
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	receiver := &pyroscopetest.Receiver{}
	pyroscopetest.Serve(t, receiver, lis)
	exp, err := pyroscope.New(pyroscope.Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go exp.Run(ctx)
	snap := &snapshot.Snapshot{}
	if err := s.p.EndInterval(snap); err != nil {
		t.Fatal(err)
	}
	exp.Export(snap)
	stamp := view.Since.UTC().Format(time.RFC3339)
	type seen struct{ tensorSeries, labelled int }
	got := waitfor.Value(t, "tensor series pushed to Pyroscope", hangLimit, func() (s seen) {
		for _, push := range receiver.Received() {
			for _, series := range push.Series {
				l := pyroscopetest.Labels(series)
				if l["kind"] == memory.KindTensor.String() && l["pid"] == strconv.Itoa(int(view.PID)) {
					s.tensorSeries++
					if l[pyroscope.LabelTensorViewSince] == stamp {
						s.labelled++
					}
				}
			}
		}
		return s
	}, func(s seen) bool { return s.tensorSeries > 0 })
	if got.labelled != got.tensorSeries {
		t.Errorf("Pyroscope: %d of %d tensor series say %s=%s", got.labelled, got.tensorSeries, pyroscope.LabelTensorViewSince, stamp)
	}
}

// checkOutputsSay checks that the JSON report's list jsonKey holds one V
// that says say, that top and the pprof comments say it, and that the HTML
// page's data has htmlKey.
func checkOutputsSay[V fmt.Stringer](t *testing.T, r *snapshot.Snapshot, say, jsonKey, htmlKey string) {
	t.Helper()
	var out bytes.Buffer
	if err := report.WriteJSON(&out, r); err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	var listed []V
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil || json.Unmarshal(doc[jsonKey], &listed) != nil ||
		len(listed) != 1 || listed[0].String() != say {
		t.Errorf("JSON %s %+v (%v), want %s", jsonKey, listed, err, say)
	}
	out.Reset()
	if err := report.WriteTop(&out, r, 5, nil); err != nil || !strings.Contains(out.String(), say) {
		t.Errorf("top: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := report.WriteHTML(&out, r); err != nil || !strings.Contains(out.String(), htmlKey) {
		t.Errorf("HTML: %v, no %s", err, htmlKey)
	}
	out.Reset()
	if err := pprof.Write(&out, r, pprof.Comment(r)...); err != nil {
		t.Fatal(err)
	}
	if p, err := profile.Parse(&out); err != nil || !strings.Contains(strings.Join(p.Comments, "\n"), say) {
		t.Errorf("pprof comments: %v %v", err, p.Comments)
	}
}

// gather scrapes the session's profiler's metrics.
func gather(t *testing.T, s *session) []*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.Collector{Source: s.p})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return families
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestTensorsCommand: `gpumem tensors` switches a process's tensor view on
// and off in the running agent through its control socket, and says what
// it cannot do.
func TestTensorsCommand(t *testing.T) {
	w := startLate(t, pythons(t)[2])
	socket := t.TempDir() + "/control.sock"
	agent := startCLI(t, "agent", "--library", simLib, "--pid", strconv.Itoa(w.pid), "--control-socket", socket, "--pyroscope-interval", "200ms")
	agent.waitEvent(logs.ControlSocket, "path", socket)
	tensors := func(args ...string) (string, error) {
		out, err := exec.Command(gpumem, append([]string{"tensors", "--control-socket", socket}, args...)...).CombinedOutput()
		return string(out), err
	}
	w.early()
	if out, err := tensors("on", strconv.Itoa(w.pid), "--for", "1h", "--budget", "25%"); err != nil {
		t.Fatalf("on: %v %s", err, out)
	}
	views := controltest.Agent(socket)
	controltest.WaitView(t, views, w.pid, "tensor view on", hangLimit, func(v snapshot.TensorView) bool { return !v.Since.IsZero() })
	out, err := tensors("list")
	if err != nil || !strings.Contains(out, fmt.Sprintf("%d  control  25%%", w.pid)) {
		t.Errorf("list: %v\n%s", err, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"on", "999999999"}, "no process with pid 999999999"},
		{[]string{"on", "x"}, `not a PID: "x"`},
		{[]string{"on"}, "on needs a PID"},
		{[]string{"on", strconv.Itoa(w.pid), "--for", "-1s"}, "--for: want a positive duration"},
		{[]string{"on", strconv.Itoa(w.pid), "--budget", "lots"}, `--budget: want a share of the process's time from 0 (no budget) to 1, or a percentage, got "lots"`},
	} {
		if out, err := tensors(c.args...); err == nil || !strings.Contains(out, c.want) {
			t.Errorf("tensors %v: %v %q, want %q", c.args, err, out, c.want)
		}
	}
	if out, err := tensors("off", strconv.Itoa(w.pid)); err != nil {
		t.Fatalf("off: %v %s", err, out)
	}
	controltest.WaitView(t, views, w.pid, "tensor view switched off", hangLimit, func(v snapshot.TensorView) bool {
		return !v.Ended.IsZero() && v.Why == "switched off"
	})
	if out, err := tensors("off", strconv.Itoa(w.pid)); err == nil || !strings.Contains(out, "no tensor view on") {
		t.Errorf("off twice: %v %s", err, out)
	}
	w.run()
	w.exit()
	agent.interrupt()
}
