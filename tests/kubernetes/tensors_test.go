package kubernetes

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-mem/gpu-mem/control/controltest"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/metrics"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/tests/cgrouptest"
)

// TestTensorViewByAnnotation: the agent, as the chart runs it (the tensor
// view on demand), switches a process's tensor view on when its pod is
// annotated gpu-mem.io/tensors: "true", from then on exactly, and off when
// the annotation goes, through a real API server's watch.
func TestTensorViewByAnnotation(t *testing.T) {
	tr := startTrainerAgent(t, "--pyroscope-interval", "200ms")
	c, pod, url := tr.cluster, tr.pod, tr.metrics
	w, pid := tr.workload(t, "tensor_late")
	annotate(t, c, pod.Name, `{"metadata":{"annotations":{"gpu-mem.io/tensors":"true"}}}`)
	fmt.Fprintln(w.stdin)
	if !w.out.Scan() || w.out.Text() != "early" {
		t.Fatal("workload did not make its early tensors")
	}
	controltest.WaitView(t, tr.views, pid, "tensor view on, asked by the pod", hangLimit, func(v snapshot.TensorView) bool {
		return v.By == snapshot.ByAnnotation && !v.Since.IsZero() && v.Ended.IsZero()
	})
	fmt.Fprintln(w.stdin)
	if !w.out.Scan() || w.out.Text() != "done" {
		t.Fatal("workload did not make its late tensors")
	}
	// The late tensors alone: 2 x 2 MiB held; the early ones' frees apart.
	families := metricstest.ScrapeUntil(t, url, hangLimit, func(m map[string]*dto.MetricFamily) bool {
		return tensorLive(m, pid) == 4<<20 && counter(m, metrics.FreesBeforeViewName) == 2
	})
	if since := families[metrics.TensorViewSinceName].GetMetric(); len(since) != 1 || metricstest.Labels(since[0])["pid"] != strconv.Itoa(pid) {
		t.Errorf("%s: %v", metrics.TensorViewSinceName, since)
	}
	if n := counter(families, metrics.UnknownFreesName); n != 0 {
		t.Errorf("unknown frees %v", n)
	}

	annotate(t, c, pod.Name, `{"metadata":{"annotations":{"gpu-mem.io/tensors":null}}}`)
	controltest.WaitView(t, tr.views, pid, "tensor view ended as the annotation went", hangLimit, func(v snapshot.TensorView) bool {
		return !v.Ended.IsZero() && v.Why == "the pod's annotation is gone"
	})
	// The view ends before its books close: their release is waited for.
	families = metricstest.ScrapeUntil(t, url, hangLimit, func(m map[string]*dto.MetricFamily) bool {
		return len(m[metrics.TensorViewSinceName].GetMetric()) == 0 && tensorLive(m, pid) == 0
	})
	if live := tensorLive(families, pid); live != 0 {
		t.Errorf("switched off, the tensor view still holds %v bytes", live)
	}
}

// TestTensorBudgetByAnnotation: a pod's tensor view that costs its process
// more than the agent's budget is switched off once, said with the numbers,
// and stays off while the pod asks the same; the pod's own budget
// (gpu-mem.io/tensors-budget) switches it on again and keeps it on at that
// cost. An annotation the agent cannot read is said, not taken for
// another ask.
func TestTensorBudgetByAnnotation(t *testing.T) {
	// 200 tensors a second (simwork's tensor_steady) at 1 ms each: 20% of
	// a thread, over the 2% budget, measured over windows of 200ms.
	const window = 200 * time.Millisecond
	tr := startTrainerAgent(t, "--tensor-pair-cost", "1ms", "--budget-window", window.String())
	c, pod, agent, url := tr.cluster, tr.pod, tr.agent, tr.metrics
	w, pid := tr.workload(t, "tensor_steady", "SIMWORK_RATE=200")
	fmt.Fprintln(w.stdin)
	over := fmt.Sprintf("pid %d: tensor view off: over budget: ", pid)

	annotate(t, c, pod.Name, `{"metadata":{"annotations":{"gpu-mem.io/tensors":"true","gpu-mem.io/tensors-until":"tomorrow"}}}`)
	agent.waitSaid(t, fmt.Sprintf("pid %d: tensor view not switched on: its pod's annotations: gpu-mem.io/tensors-until: "+
		`want an RFC 3339 time (2026-12-02T10:00:00Z), got "tomorrow"`, pid))
	annotate(t, c, pod.Name, `{"metadata":{"annotations":{"gpu-mem.io/tensors-until":null}}}`)
	ended := controltest.WaitView(t, tr.views, pid, "tensor view ended over budget", hangLimit, func(v snapshot.TensorView) bool {
		return v.OverBudget && !v.Ended.IsZero()
	})
	agent.waitSaid(t, over) // said as it ended: the words are what is checked here
	if said := agent.saidTimes(over); len(said) != 1 || !strings.Contains(said[0], "more than 2.0%; a budget of its own keeps it on") {
		t.Errorf("said %q", said)
	}
	// The pods' asks are read at every scan: once a process started in the
	// pod after the view ended has its view on (asked once it calls the
	// driver), a scan has read the same ask of the ended view, which stays
	// off.
	lw, late := tr.workload(t, "tensor_late")
	fmt.Fprintln(lw.stdin)
	if !lw.out.Scan() || lw.out.Text() != "early" {
		t.Fatal("the later workload did not make its early tensors")
	}
	controltest.WaitView(t, tr.views, late, "tensor view of a process started later", hangLimit, func(v snapshot.TensorView) bool {
		return !v.Since.IsZero()
	})
	if v := controltest.WaitView(t, tr.views, pid, "the ended view", hangLimit, func(snapshot.TensorView) bool { return true }); v != ended {
		t.Fatalf("the pod's view %+v, want it kept as it ended: %+v", v, ended)
	}

	annotate(t, c, pod.Name, `{"metadata":{"annotations":{"gpu-mem.io/tensors-budget":"50%"}}}`)
	controltest.WaitView(t, tr.views, pid, "tensor view on again at the pod's 50%", hangLimit, func(v snapshot.TensorView) bool {
		return v.Asked.After(ended.Asked) && v.Budget == 0.5 && !v.Since.IsZero() && v.Ended.IsZero()
	})
	// Kept on at 20% of 50%: the view counts the tensors of three windows
	// more, its budget never exceeded again.
	allocations := metrics.ViewNames(memory.ViewTensor).Allocations
	base := pidCounter(metricstest.Scrape(t, url), allocations, pid)
	families := metricstest.ScrapeUntil(t, url, hangLimit, func(m map[string]*dto.MetricFamily) bool {
		return pidCounter(m, allocations, pid) >= base+3*window.Seconds()*200 || counter(m, metrics.TensorBudgetExceededName) != 1
	})
	if n := counter(families, metrics.TensorBudgetExceededName); n != 1 || !viewOn(families, pid) {
		t.Errorf("%s %v, want 1; the view on: %v", metrics.TensorBudgetExceededName, n, viewOn(families, pid))
	}
	if n := len(agent.saidTimes(over)); n != 1 {
		t.Errorf("the view was switched off by the budget %d times, want once: the pod's 50%% holds 20%%", n)
	}
	fmt.Fprintln(w.stdin)
}

// viewOn says whether pid's on-demand tensor view is on.
func viewOn(m map[string]*dto.MetricFamily, pid int) bool {
	for _, s := range m[metrics.TensorViewSinceName].GetMetric() {
		if metricstest.Labels(s)["pid"] == strconv.Itoa(pid) {
			return true
		}
	}
	return false
}

// pidCounter is the counter name's sum over pid's series.
func pidCounter(m map[string]*dto.MetricFamily, name string, pid int) float64 {
	var sum float64
	for _, s := range m[name].GetMetric() {
		if metricstest.Labels(s)["pid"] == strconv.Itoa(pid) {
			sum += s.GetCounter().GetValue()
		}
	}
	return sum
}

// trainer is the trainer's pod in a cluster, with the agent started
// first, as the chart runs it (the tensor view on demand).
type trainer struct {
	cluster *cluster
	pod     *corev1.Pod
	agent   *process
	driver  agentDriver
	metrics string // the agent's metrics' URL
	views   controltest.Views
}

func startTrainerAgent(t *testing.T, args ...string) *trainer {
	t.Helper()
	tr := &trainer{cluster: startCluster(t)}
	tr.pod = trainerPod(t, tr.cluster)
	socket := filepath.Join(t.TempDir(), "control.sock")
	tr.views = controltest.Agent(socket)
	tr.agent, tr.driver = startAgentFirst(t, 2, func(args ...string) *process {
		return start(t, nil, filepath.Join(root, "bin/gpumem"), args...)
	}, append([]string{"--kubeconfig", tr.cluster.kubeconfig, "--node-name", "node-1", "--metrics-address", "127.0.0.1:0",
		"--control-socket", socket}, args...)...)
	tr.metrics = tr.agent.metricsURL(t)
	return tr
}

// workload starts simwork.py's scenario in the trainer's container, with
// env, once it said it is ready.
func (tr *trainer) workload(t *testing.T, scenario string, env ...string) (*process, int) {
	t.Helper()
	env = append(append(env, "SIMTORCH_LIB="+filepath.Join(root, "build/sim/libc10_cuda.so")), tr.driver.pyEnv...)
	w := start(t, env, "/root/.pyenv/versions/3.12.1/bin/python3.12", filepath.Join(root, "tests/workloads/simwork.py"), scenario)
	if !w.out.Scan() {
		t.Fatal("workload did not start")
	}
	cgrouptest.InContainer(t, w.cmd.Process.Pid, string(tr.pod.UID), containerID)
	return w, w.cmd.Process.Pid
}

func annotate(t *testing.T, c *cluster, name, patch string) {
	t.Helper()
	if _, err := c.client.CoreV1().Pods("ml").Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// tensorLive sums the process's gpumem_tensor_live_bytes.
func tensorLive(m map[string]*dto.MetricFamily, pid int) float64 {
	var sum float64
	for _, s := range m[metrics.ViewNames(memory.ViewTensor).LiveBytes].GetMetric() {
		if metricstest.Labels(s)["pid"] == strconv.Itoa(pid) {
			sum += s.GetGauge().GetValue()
		}
	}
	return sum
}

func counter(m map[string]*dto.MetricFamily, name string) float64 {
	var sum float64
	for _, s := range m[name].GetMetric() {
		sum += s.GetCounter().GetValue()
	}
	return sum
}
