package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/tests/promqltest"
)

// TestChartAlerts: the chart renders no PrometheusRule by default; with
// alerts.enabled, one whose rules are the plain rules file it ships
// (alerts/gpu-mem.rules.yaml) at the default thresholds, its labels the
// chart's and alerts.labels; the agent's --growth-intervals is the
// chart's growth.intervals.
func TestChartAlerts(t *testing.T) {
	objects := render(t, nil)
	if rules := objects["PrometheusRule"]; rules != nil {
		t.Errorf("a PrometheusRule by default: %v", rules)
	}
	args := strings.Join(toStrings(dig(objects["DaemonSet"][0], "spec", "template", "spec", "containers", 0, "args")), " ")
	if !strings.Contains(args, "--growth-intervals=4") {
		t.Errorf("args %s", args)
	}
	rule := render(t, map[string]any{"alerts": map[string]any{"enabled": true, "labels": map[string]any{"release": "kube-prometheus-stack"}}})["PrometheusRule"]
	if len(rule) != 1 {
		t.Fatalf("PrometheusRule %v, want one", rule)
	}
	if dig(rule[0], "metadata", "labels", "release") != "kube-prometheus-stack" || dig(rule[0], "metadata", "labels", "app.kubernetes.io/name") == nil {
		t.Errorf("labels %v", dig(rule[0], "metadata", "labels"))
	}
	data, err := os.ReadFile(filepath.Join(repoRoot, "charts/gpu-mem/alerts/gpu-mem.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var plain map[string]any
	if err := yaml.Unmarshal(data, &plain); err != nil {
		t.Fatal(err)
	}
	if spec := rule[0]["spec"]; !reflect.DeepEqual(spec, plain) {
		t.Errorf("the PrometheusRule's spec\n%v\nis not the plain rules file\n%v", spec, plain)
	}
}

// TestAlertsFire: the alerts as the chart renders them (growingForSeconds
// 2, the rest its defaults), evaluated by Prometheus's own rule manager
// every 200 ms over the real agent's metrics (started first, an interval a
// second, the simulated NVML read) as Prometheus scrapes them. Beside each
// other, simwork.py's leak (leak_step keeps 1 MiB a step, a step every 50
// ms) and the same loop without the leak (noleak: a steady loop, a cache
// that fills and stays). For the leak both alerts fire, their labels and
// annotations naming its pid and leak_step, the function that leaks; for
// the other, neither. The agent's other outputs say the same: its status
// line names the leak's stack, and its pushes to Pyroscope carry a
// memory:growth_space profile of the leak alone, under leak_step, in
// whole MiB.
func TestAlertsFire(t *testing.T) {
	env := nvmlState(t, 7*MiB)
	t.Setenv("SIMCUDA_CAPACITY", strconv.Itoa(4<<30))
	env = append(env, "SIMCUDA_CAPACITY="+strconv.Itoa(4<<30))
	receiver := &pyroscopetest.Receiver{}
	c, driver := startAgentFirst(t, 1, "--tensors=false", "--metrics-address", "127.0.0.1:0", "--pyroscope-interval", "1s",
		"--nvml-library", simNVML(), "--pyroscope-url", serveReceiver(t, receiver))
	script := filepath.Join(repoRoot, "tests/workloads/simwork.py")
	leak := startWorkload(t, append(env, driver.pyEnv...), pythons(t)[2], script, "leak")
	steady := startWorkload(t, append(env, driver.pyEnv...), pythons(t)[2], script, "noleak")
	for _, w := range []*workload{leak, steady} {
		w.stdinLine("")
		if line := w.line(); line != "step" {
			t.Fatalf("workload said %q, want step", line)
		}
		go stepEvery(w, 50*time.Millisecond)
	}
	rules := chartRules(t, map[string]any{"enabled": true, "growingForSeconds": 2})
	prom := promqltest.Start(t, repoRoot, c.metricsURL(), "-rules", rules)

	pid := strconv.Itoa(leak.pid)
	fired := waitfor.Value(t, "both alerts of the leak", hangLimit, prom.Alerts, func(alerts []promqltest.Alert) bool {
		return slices.ContainsFunc(alerts, firing("GPUMemoryGrowing", pid)) && slices.ContainsFunc(alerts, firing("GPUMemoryExhaustion", pid))
	})
	for _, a := range fired {
		if a.Labels["pid"] != pid {
			t.Errorf("%s fired for pid %s, not the leak's (%s): %v", a.Name, a.Labels["pid"], pid, a.Labels)
			continue
		}
		if a.Labels["function"] != "leak_step" || a.Labels["gpu"] != "0" {
			t.Errorf("%s: labels %v, want function leak_step on gpu 0", a.Name, a.Labels)
		}
		for _, text := range a.Annotations {
			if !strings.Contains(text, "pid "+pid) || !strings.Contains(text, "leak_step") {
				t.Errorf("%s: annotation %q does not name pid %s and leak_step", a.Name, text, pid)
			}
		}
	}
	if a := fired[slices.IndexFunc(fired, firing("GPUMemoryGrowing", pid))]; a.Value <= 2 || a.Labels["severity"] != "warning" {
		t.Errorf("GPUMemoryGrowing at %v s, severity %s: want more than 2, warning", a.Value, a.Labels["severity"])
	}
	if line := waitLines(t, c, "growing: pid "+pid+" ")[0]; !strings.Contains(line, "under leak_step <- leak <- main for ") {
		t.Errorf("status line %q, want the leak's stack", line)
	}
	checkGrowthPushed(t, receiver.Received(), leak.pid)
}

// checkGrowthPushed: the pushes' growth profiles (memory:growth_space)
// are of pid alone, each a sample under leak_step of whole MiB, at least
// the four the detection's window takes.
func checkGrowthPushed(t *testing.T, pushes []*pushv1.PushRequest, pid int) {
	t.Helper()
	n := 0
	for _, req := range pushes {
		for _, series := range req.Series {
			p := parseSeries(t, series)
			if p.SampleType[0].Type != "growth_space" {
				continue
			}
			n++
			if len(p.Sample) != 1 || p.Sample[0].NumLabel["pid"][0] != int64(pid) {
				t.Errorf("growth profile %v, want one sample of pid %d", p, pid)
				continue
			}
			s := p.Sample[0]
			if fn := pythonLeaf(s); fn != "leak_step" || s.Value[0] < 4*MiB || s.Value[0]%MiB != 0 {
				t.Errorf("growth sample of %d bytes under %s, want whole MiB, 4 or more, under leak_step", s.Value[0], fn)
			}
		}
	}
	if n == 0 {
		t.Errorf("no growth profile among %d pushes", len(pushes))
	}
}

// pythonLeaf is the innermost Python function of a sample's stack.
func pythonLeaf(s *profile.Sample) string {
	for _, loc := range s.Location {
		for _, line := range loc.Line {
			if line.Function.Filename != "" && strings.HasSuffix(line.Function.Filename, ".py") {
				return line.Function.Name
			}
		}
	}
	return ""
}

// firing matches an alert of name for pid.
func firing(name, pid string) func(promqltest.Alert) bool {
	return func(a promqltest.Alert) bool { return a.Name == name && a.Labels["pid"] == pid }
}

// stepEvery runs a step of simwork.py's leak scenario every period until
// the workload ends.
func stepEvery(w *workload, period time.Duration) {
	for range time.Tick(period) {
		if _, err := fmt.Fprintln(w.stdin, "step"); err != nil || !w.stdout.Scan() {
			return
		}
	}
}

// chartRules writes the rules of the PrometheusRule the chart renders with
// alerts as given to a rules file, and returns its path.
func chartRules(t *testing.T, alerts map[string]any) string {
	t.Helper()
	rule := render(t, map[string]any{"alerts": alerts})["PrometheusRule"]
	if len(rule) != 1 {
		t.Fatalf("PrometheusRule %v, want one", rule)
	}
	data, err := yaml.Marshal(rule[0]["spec"])
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "gpu-mem.rules.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
