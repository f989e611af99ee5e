package kubernetes

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/metrics"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/tests/cgrouptest"
)

// TestTensorViewByAnnotation: the agent, as the chart runs it (the tensor
// view on demand), switches a process's tensor view on when its pod is
// annotated gpu-mem.io/tensors: "true", from then on exactly, and off when
// the annotation goes, through a real API server's watch.
func TestTensorViewByAnnotation(t *testing.T) {
	c := startCluster(t)
	pod := trainerPod(t, c)
	agent, driver := startAgentFirst(t, 2, func(args ...string) *process {
		return start(t, nil, filepath.Join(root, "bin/gpumem"), args...)
	}, "--kubeconfig", c.kubeconfig, "--node-name", "node-1", "--metrics-address", "127.0.0.1:0",
		"--pyroscope-interval", "200ms", "--control-socket", filepath.Join(t.TempDir(), "control.sock"))
	url := agent.saidValue(t, "serving metrics at ")

	w := start(t, append([]string{"SIMTORCH_LIB=" + filepath.Join(root, "build/sim/libc10_cuda.so")}, driver.pyEnv...),
		"/root/.pyenv/versions/3.12.1/bin/python3.12", filepath.Join(root, "tests/workloads/simwork.py"), "tensor_late")
	if !w.out.Scan() {
		t.Fatal("workload did not start")
	}
	pid := w.cmd.Process.Pid
	cgrouptest.InContainer(t, pid, string(pod.UID), containerID)
	annotate(t, c, pod.Name, `{"metadata":{"annotations":{"gpu-mem.io/tensors":"true"}}}`)
	fmt.Fprintln(w.stdin)
	if !w.out.Scan() || w.out.Text() != "early" {
		t.Fatal("workload did not make its early tensors")
	}
	agent.waitSaid(t, fmt.Sprintf("pid %d: tensor view asked by its pod", pid), fmt.Sprintf("pid %d: tensor view on since", pid))
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
	agent.waitSaid(t, fmt.Sprintf("pid %d: tensor view off: the pod's annotation is gone", pid))
	families = metricstest.ScrapeUntil(t, url, hangLimit, func(m map[string]*dto.MetricFamily) bool {
		return len(m[metrics.TensorViewSinceName].GetMetric()) == 0
	})
	if live := tensorLive(families, pid); live != 0 {
		t.Errorf("switched off, the tensor view still holds %v bytes", live)
	}
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
