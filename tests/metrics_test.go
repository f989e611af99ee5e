package tests

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
)

// TestMetrics scrapes `gpumem agent --metrics-address` with a real HTTP
// client and reads it with the Prometheus text parser: live bytes per
// process, kind and GPU, failures by code, loss counters.
func TestMetrics(t *testing.T) {
	w := startWorkload(t, []string{"SIMCUDA_DEVICES=3"}, simwork, "devices")
	oom := startWorkload(t, []string{"SIMCUDA_CAPACITY=1000000"}, simwork, "oom", "2000000")
	c := startCLI(t, "agent", "--pid", strconv.Itoa(w.pid)+","+strconv.Itoa(oom.pid),
		"--metrics-address", "127.0.0.1:0", "--pyroscope-interval", "200ms")
	url := c.waitStderrValue("serving metrics at ")
	c.waitStderr("attached to")
	w.run()
	oom.run()
	time.Sleep(300 * time.Millisecond) // the reader polls every 10 ms

	families := metricstest.Scrape(t, url)
	live := map[string]float64{}
	for _, m := range families["gpumem_live_bytes"].GetMetric() {
		l := metricstest.Labels(m)
		if l["pid"] == strconv.Itoa(w.pid) {
			live[l["kind"]+"/"+l["gpu"]] = m.GetGauge().GetValue()
		}
		if l["comm"] != "simwork" {
			t.Errorf("comm %q", l["comm"])
		}
	}
	want := map[string]float64{
		"device/0": 18 * MiB, "device/1": 30 * MiB, "device/2": 10 * MiB, "vmm/2": 19 * MiB,
		"host-pinned/host": 4096, "managed/managed": 8192,
	}
	for k, v := range want {
		if live[k] != v {
			t.Errorf("live %s: %v, want %v (all: %v)", k, live[k], v, live)
		}
	}
	var ooms float64
	for _, m := range families["gpumem_failures_total"].GetMetric() {
		if l := metricstest.Labels(m); l["pid"] == strconv.Itoa(oom.pid) && l["code"] == "2" {
			ooms += m.GetCounter().GetValue()
		}
	}
	if ooms != 1 {
		t.Errorf("out-of-memory failures %v, want 1: %v", ooms, families["gpumem_failures_total"])
	}
	if n := len(families["gpumem_losses_total"].GetMetric()); n != 4 {
		t.Errorf("%d loss counters", n)
	}
	for _, m := range families["gpumem_losses_total"].GetMetric() {
		if m.GetCounter().GetValue() != 0 {
			t.Errorf("loss %v", m)
		}
	}
	c.interrupt()
	w.exit()
	oom.exit()
}

// waitStderrValue waits for a stderr line containing prefix and returns
// what follows it.
func (c *cli) waitStderrValue(prefix string) string {
	c.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("gpumem ended before saying %q", prefix)
			}
			if _, v, found := strings.Cut(line, prefix); found {
				return v
			}
		case <-timeout:
			c.t.Fatalf("gpumem did not say %q", prefix)
		}
	}
}
