package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/tests/cgrouptest"
)

// inPodCgroup moves pid into a pod container's cgroup and returns the pod
// UID and container ID it encodes.
func inPodCgroup(t *testing.T, pid int) (podUID, containerID string) {
	podUID = "5f3b8a1e-2c4d-4e6f-8a0b-1c2d3e4f5a6b"
	containerID = strings.Repeat("3f8a2b1c", 8)
	cgrouptest.InContainer(t, pid, podUID, containerID)
	return podUID, containerID
}

// TestPodFromCgroup: a process in a pod's cgroup carries the pod UID and
// container ID on JSON stacks and on metrics.
func TestPodFromCgroup(t *testing.T) {
	w := startWorkload(t, nil, simwork, "hold", "4096")
	podUID, containerID := inPodCgroup(t, w.pid)
	out := filepath.Join(t.TempDir(), "pod.json")
	c := startCLI(t, "record", "--pid", strconv.Itoa(w.pid), "--format", "json", "-o", out)
	c.waitEvent(logs.Attached, "kind", "driver")
	w.run()
	c.interrupt()
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Stacks []struct {
			PodUID      string `json:"pod_uid"`
			ContainerID string `json:"container_id"`
			LiveBytes   uint64 `json:"live_bytes"`
		}
	}
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Stacks) != 1 || r.Stacks[0].PodUID != podUID || r.Stacks[0].ContainerID != containerID || r.Stacks[0].LiveBytes != 4096 {
		t.Errorf("stacks %+v", r.Stacks)
	}

	w.exit()

	// The agent, started first as a DaemonSet, on its own driver (the
	// count of series below is of its processes only; without the tensor
	// view, another package's process on the simulated allocator counts in
	// no status line). The workload is in the pod's cgroup before it loads
	// the driver, as a container's process is from its start: a shell,
	// moved there, then replaced by simwork (the same PID), whose context,
	// made before "ready", is the agent's first event of it, traced: its
	// device is known.
	a, driver := startAgentFirst(t, 3, "--tensors=false", "--metrics-address", "127.0.0.1:0", "--pyroscope-interval", "200ms")
	url := a.metricsURL()
	m := startWorkload(t, driver.env, "sh", "-c", `echo ready $$; read go; exec "$0" hold 8192`, simwork)
	inPodCgroup(t, m.pid)
	// Released at once: this test waited a second here while a process
	// first seen by its context kept the record read then; since a process
	// is read again at its first allocation (profiler's note), no wait.
	fmt.Fprintln(m.stdin)
	if line := m.line(); line != "ready "+strconv.Itoa(m.pid) {
		t.Fatalf("simwork said %q, want ready %d", line, m.pid)
	}
	m.run()
	series := metricstest.ScrapeUntil(t, url, hangLimit, func(f map[string]*dto.MetricFamily) bool {
		return liveByKindGPU(f, m.pid)["device/0"] == 8192
	})["gpumem_live_bytes"].GetMetric()
	if len(series) != 1 {
		t.Fatalf("%d series", len(series))
	}
	l := metricstest.Labels(series[0])
	if l["pod_uid"] != podUID || l["container_id"] != containerID || series[0].GetGauge().GetValue() != 8192 {
		t.Errorf("metric %v", series[0])
	}
	a.interrupt()
	m.exit()
}
