package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/tests/bpffs"
	"github.com/gpu-mem/gpu-mem/tests/cgrouptest"
	"github.com/gpu-mem/gpu-mem/tests/chartrender"
	"github.com/gpu-mem/gpu-mem/tests/podsecurity"
)

const mib = 1 << 20

// applyDaemonSet creates (or, at a helm upgrade, updates) the chart's
// DaemonSet, rendered with values, in the API server, and returns it as
// the server keeps it.
func applyDaemonSet(t *testing.T, c *cluster, values map[string]any) *appsv1.DaemonSet {
	t.Helper()
	objects, err := chartrender.Render(root, "gpu", values)
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	for _, obj := range objects {
		if obj["kind"] == "DaemonSet" {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, &ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx := context.Background()
	client := c.client.AppsV1().DaemonSets("gpu")
	old, err := client.Get(ctx, ds.Name, metav1.GetOptions{})
	var kept *appsv1.DaemonSet
	if err != nil {
		kept, err = client.Create(ctx, &ds, metav1.CreateOptions{})
	} else {
		ds.ResourceVersion = old.ResourceVersion
		kept, err = client.Update(ctx, &ds, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	return kept
}

// podArgs are the agent's arguments in ds's pod, as its container runs
// them: the state directory and the BPF file system are the test's (the
// host paths the pod mounts), the metrics on loopback, and the node and
// the API server the test's.
func podArgs(ds *appsv1.DaemonSet, stateDir, pinPath string, extra ...string) []string {
	var args []string
	for _, a := range ds.Spec.Template.Spec.Containers[0].Args[1:] { // past "agent"
		name, _, _ := strings.Cut(a, "=")
		switch name {
		case "--state-dir":
			a = "--state-dir=" + stateDir
		case "--pin-path":
			a = "--pin-path=" + pinPath
		case "--metrics-address", "--node-name", "--log-format":
			continue // the test's, in extra
		}
		args = append(args, a)
	}
	return append(args, extra...)
}

// TestChartRollout (issue 56, point 2): helm upgrade as Kubernetes rolls
// it out. The chart's DaemonSet is created in the API server, its agent
// runs as its pod runs it (the chart's privileges, its state on the host)
// while a Python process in a pod holds memory; the DaemonSet is updated
// (a value changed, as helm upgrade does), and the rollout its update
// strategy says happens: the old agent stopped (SIGTERM) within its grace
// period, the process frees and allocates meanwhile, the new agent started
// with the new pod's arguments. The new agent's metrics go on where the
// old one's left them: live bytes exact, no counter reset (more by the
// gap's allocations exactly); its pushes to Pyroscope have every live byte
// under its Python function, the old ones' too.
func TestChartRollout(t *testing.T) {
	sc, err := podsecurity.FromChart(root)
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t)
	namespace(t, c, "gpu")
	pod := trainerPod(t, c)
	receiver, addr := pyroscopetest.Loopback(t)
	values := func(driverBudget float64) map[string]any {
		return map[string]any{"pyroscope": map[string]any{"url": "http://" + addr, "interval": "200ms"}, "driverBudget": driverBudget}
	}
	ds := applyDaemonSet(t, c, values(0.02))
	if s := ds.Spec.UpdateStrategy; s.Type != appsv1.RollingUpdateDaemonSetStrategyType || s.RollingUpdate.MaxSurge.IntValue() != 0 || s.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Fatalf("update strategy %+v: the old agent must stop before the new one starts", s)
	}
	stateDir, pinPath := t.TempDir(), filepath.Join(bpffs.Mount(t), "gpu-mem")
	sc = sc.WithVolumes(stateDir) // the pod's hostPath volume
	extra := []string{"--kubeconfig", c.kubeconfig, "--node-name", "node-1", "--metrics-address", "127.0.0.1:0"}
	launch := func(args ...string) *process { return startAs(t, sc, args...) }
	old, driver := startAgentFirst(t, 3, launch, podArgs(ds, stateDir, pinPath, extra...)...)
	url := old.metricsURL(t)

	w := start(t, driver.pyEnv, "/root/.pyenv/versions/3.12.1/bin/python3.12", filepath.Join(root, "tests/workloads/simwork.py"), "restart")
	if !w.out.Scan() || !strings.HasPrefix(w.out.Text(), "ready ") {
		t.Fatal("workload did not start")
	}
	pid := w.cmd.Process.Pid
	cgrouptest.InContainer(t, pid, string(pod.UID), containerID)
	old.waitEvent(t, logs.Python, "pid", pid)
	step := func(want string) {
		t.Helper()
		fmt.Fprintln(w.stdin)
		if !w.out.Scan() || w.out.Text() != want {
			t.Fatalf("workload said %q, want %q", w.out.Text(), want)
		}
	}
	step("held")
	names := map[string]string{"namespace": "ml", "pod": "trainer-5d9f8-x2x7z", "container": "trainer"}
	allocated := func(f map[string]*dto.MetricFamily) float64 {
		for _, m := range f["mem_alloc_bytes_total"].GetMetric() {
			if l := metricstest.Labels(m); l["pid"] == strconv.Itoa(pid) && l["host_raw"] == "0" {
				return m.GetCounter().GetValue()
			}
		}
		return 0
	}
	before := metricstest.ScrapeUntil(t, url, hangLimit, func(f map[string]*dto.MetricFamily) bool {
		return namedLive(f["gpumem_live_bytes"], pid, names) == 14*mib && allocated(f) == 14*mib
	})
	if live, n := namedLive(before["gpumem_live_bytes"], pid, names), allocated(before); live != 14*mib || n != 14*mib {
		t.Fatalf("before the rollout: %d live, %v allocated; want %d, %d", live, n, 14*mib, 14*mib)
	}

	// helm upgrade: the DaemonSet's pod changed; the rollout stops the old
	// agent within the grace period, then starts the new pod's.
	ds = applyDaemonSet(t, c, values(0.05))
	if ds.Generation != 2 {
		t.Fatalf("the upgraded DaemonSet's generation %d", ds.Generation)
	}
	grace := time.Duration(*ds.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	stopped := time.Now()
	old.cmd.Process.Signal(syscall.SIGTERM)
	if err := old.cmd.Wait(); err != nil {
		t.Fatalf("the old agent at SIGTERM: %v", err)
	}
	if took := time.Since(stopped); took > grace {
		t.Errorf("the old agent took %v to stop, past its grace period %v", took, grace)
	}
	step("gap_one") // a scratch buffer freed, gap_one's 5 MiB made, while no agent runs

	pushed := len(receiver.Received())
	agent := launch(append([]string{"--log-format=json", "agent", "--library", driver.path, "--status-interval", "200ms"}, podArgs(ds, stateDir, pinPath, extra...)...)...)
	agent.waitEvent(t, logs.State, "continued", true)
	url = agent.metricsURL(t)
	after := metricstest.ScrapeUntil(t, url, hangLimit, func(f map[string]*dto.MetricFamily) bool {
		return namedLive(f["gpumem_live_bytes"], pid, names) == 18*mib
	})
	if live := namedLive(after["gpumem_live_bytes"], pid, names); live != 18*mib {
		t.Fatalf("after the rollout: %d live, want %d", live, 18*mib)
	}
	if a, b := allocated(before), allocated(after); b != a+5*mib {
		t.Errorf("mem_alloc_bytes_total %v before the rollout, %v after: want %v (the gap's allocation more, no reset)", a, b, a+5*mib)
	}

	// In Pyroscope, from the new agent: every live byte under its function.
	want := map[string]int64{"restart_weights": 12 * mib, "restart_scratch": 1 * mib, "gap_one": 5 * mib}
	byFunction := func() map[string]int64 {
		got := receiver.Received()
		for i := len(got) - 1; i >= pushed; i-- {
			for _, s := range got[i].Series {
				if l := pyroscopetest.Labels(s); l["pid"] == strconv.Itoa(pid) && l["kind"] == "device" && l["__name__"] == "memory" {
					return liveByPythonFunction(t, s.Samples[0].RawProfile, "inuse_space", "restart_weights", "restart_scratch", "gap_one")
				}
			}
		}
		return nil
	}
	waitfor.Value(t, fmt.Sprintf("the new agent's pushes by Python function %v", want), hangLimit, byFunction,
		func(got map[string]int64) bool { return maps.Equal(got, want) })
	agent.stop(t)
	// Each allocation pushed once: the old agent's intervals hold the
	// first 14 MiB, the new one's the gap's 5 MiB, none again.
	allocatedPushed := func(pushes []*pushv1.PushRequest) (sum int64) {
		for _, push := range pushes {
			for _, s := range push.Series {
				if l := pyroscopetest.Labels(s); l["pid"] == strconv.Itoa(pid) && l["kind"] == "device" && l["__name__"] == "memory" {
					sum += sampleSum(t, s.Samples[0].RawProfile, "alloc_space")
				}
			}
		}
		return sum
	}
	got := receiver.Received()
	if old, new := allocatedPushed(got[:pushed]), allocatedPushed(got[pushed:]); old != 14*mib || new != 5*mib {
		t.Errorf("allocations pushed: %d by the old agent, %d by the new one; want %d, %d", old, new, 14*mib, 5*mib)
	}
}

// sampleSum sums a pushed profile's values of sample type typ.
func sampleSum(t *testing.T, raw []byte, typ string) (sum int64) {
	t.Helper()
	p, at := parseProfile(t, raw, typ)
	for _, s := range p.Sample {
		sum += s.Value[at]
	}
	return sum
}
