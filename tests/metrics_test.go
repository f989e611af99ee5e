package tests

import (
	"fmt"
	"maps"
	"strconv"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/metrics"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/schema"
)

// TestMetrics scrapes `gpumem agent --metrics-address` with a real HTTP
// client and reads it with the Prometheus text parser: live bytes per
// process, kind and GPU, failures by code, loss counters.
func TestMetrics(t *testing.T) {
	// Started first, as a DaemonSet, on its own driver. Without the tensor
	// view: another package's process on the simulated allocator would
	// reach its loss counters.
	c, driver := startAgentFirst(t, 3, "--tensors=false", "--metrics-address", "127.0.0.1:0", "--pyroscope-interval", "200ms")
	url := c.metricsURL()
	w := startWorkload(t, append([]string{"SIMCUDA_DEVICES=3"}, driver.env...), simwork, "devices")
	oom := startWorkload(t, append([]string{"SIMCUDA_CAPACITY=1000000"}, driver.env...), simwork, "oom", "2000000")
	w.run()
	oom.run()
	want := map[string]float64{
		"device/0": 18 * MiB, "device/1": 30 * MiB, "device/2": 10 * MiB, "vmm/2": 19 * MiB,
		"vmm/host": 6 * MiB, "host-pinned/host": 4096, "managed/managed": 8192,
	}
	// The agent reads the events a moment after the workload sent them.
	families := metricstest.ScrapeUntil(t, url, hangLimit, func(f map[string]*dto.MetricFamily) bool {
		return maps.Equal(liveByKindGPU(f, w.pid), want) && outOfMemoryFailures(f, oom.pid) == 1
	})
	if live := liveByKindGPU(families, w.pid); !maps.Equal(live, want) {
		t.Errorf("live %v, want %v", live, want)
	}
	for _, m := range families["gpumem_live_bytes"].GetMetric() {
		if l := metricstest.Labels(m); l["comm"] != "simwork" {
			t.Errorf("comm %q", l["comm"])
		}
	}
	// Inspektor Gadget's dashboard's "GPU Active Memory": alloc - free -
	// implicit free per process and memory class, the driver view.
	active := map[string]float64{"0": (18+30+10+19)*MiB + 8192, "1": 6*MiB + 4096}
	if got := igActive(t, families, w.pid); !maps.Equal(got, active) {
		t.Errorf("mem_alloc_bytes_total - mem_free_bytes_total - mem_implicit_free_bytes_total %v, want %v", got, active)
	}
	if n := outOfMemoryFailures(families, oom.pid); n != 1 {
		t.Errorf("out-of-memory failures %v, want 1: %v", n, families["gpumem_failures_total"])
	}
	reasons := map[string]bool{}
	for _, m := range families["gpumem_losses_total"].GetMetric() {
		reasons[m.GetLabel()[0].GetValue()] = true
		if m.GetCounter().GetValue() != 0 {
			t.Errorf("loss %v", m)
		}
	}
	for l := range schema.NumLosses {
		if !reasons[l.String()] {
			t.Errorf("no loss counter %s: %v", l, reasons)
		}
	}
	if len(reasons) != int(schema.NumLosses) {
		t.Errorf("loss counters %v", reasons)
	}
	// The agent's own footprint, to watch it on a node.
	for _, name := range []string{"go_goroutines", "go_gc_heap_live_bytes", "process_resident_memory_bytes"} {
		if m := families[name].GetMetric(); len(m) != 1 || m[0].GetGauge().GetValue() <= 0 {
			t.Errorf("%s: %v", name, m)
		}
	}
	c.interrupt()
	w.exit()
	oom.exit()
}

// liveByKindGPU is a process's gpumem_live_bytes by kind/gpu.
func liveByKindGPU(families map[string]*dto.MetricFamily, pid int) map[string]float64 {
	live := map[string]float64{}
	for _, m := range families["gpumem_live_bytes"].GetMetric() {
		if l := metricstest.Labels(m); l["pid"] == strconv.Itoa(pid) {
			live[l["kind"]+"/"+l["gpu"]] = m.GetGauge().GetValue()
		}
	}
	return live
}

// igActive is what Inspektor Gadget's dashboard computes from a process's
// three counters, by host_raw; each counter's series must be there with
// the same labels, as its PromQL subtraction needs.
func igActive(t *testing.T, families map[string]*dto.MetricFamily, pid int) map[string]float64 {
	t.Helper()
	type series struct {
		hostRaw string
		bytes   float64
	}
	byLabels := func(name string) map[string]series { // by all labels
		out := map[string]series{}
		for _, m := range families[name].GetMetric() {
			if l := metricstest.Labels(m); l["pid"] == strconv.Itoa(pid) {
				out[fmt.Sprint(l)] = series{l[metrics.LabelHostRaw], m.GetCounter().GetValue()}
			}
		}
		return out
	}
	alloc, free, implicit := byLabels(metrics.IGAllocBytesName), byLabels(metrics.IGFreeBytesName), byLabels(metrics.IGImplicitFreeBytesName)
	active := map[string]float64{}
	for labels, a := range alloc {
		f, okF := free[labels]
		i, okI := implicit[labels]
		if !okF || !okI {
			t.Errorf("%s: not in all three counters", labels)
			continue
		}
		active[a.hostRaw] = a.bytes - f.bytes - i.bytes
	}
	return active
}

// outOfMemoryFailures is a process's gpumem_failures_total of code 2.
func outOfMemoryFailures(families map[string]*dto.MetricFamily, pid int) float64 {
	var n float64
	for _, m := range families["gpumem_failures_total"].GetMetric() {
		if l := metricstest.Labels(m); l["pid"] == strconv.Itoa(pid) && l["code"] == "2" {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}
