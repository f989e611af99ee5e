package tests

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/report"
)

// viewTotals are what a process holds in each view, as the simulated driver
// and the simulated allocator count it (simwork.py views): the driver's
// live bytes on the device, and the bytes the allocator's live tensors
// asked for; reserved is the allocator's segments.
type viewTotals struct {
	driver, tensor, reserved uint64
}

// TestViewsInEveryOutput: a PyTorch-shaped process (the simulated caching
// allocator, a workspace straight from the driver) recorded by every output
// at once. Each shows the driver view by default, exactly the simulated
// driver's live bytes, and the tensor view apart, exactly the allocator's
// live tensors, never their sum: pprof's inuse_space and
// tensor_inuse_space (read by go tool pprof), folded's --view, the HTML
// report's switch and its summary (allocator cache = reserved - tensors),
// record's --top summary, top, Prometheus's gpumem_live_bytes and
// gpumem_tensor_live_bytes (and gpumem_breakdown_bytes, whose parts sum to
// the driver view, its cache the segments less the tensors), and Pyroscope's memory:inuse_space and
// memory:tensor_inuse_space with no label filter.
func TestViewsInEveryOutput(t *testing.T) {
	dir := t.TempDir()
	r := &pyroscopetest.Receiver{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pyroscopetest.Serve(t, r, lis)
	// The agent first, as a DaemonSet, on its own driver; the recorders
	// after, of the workload.
	agent, driver := startAgentFirst(t, 3, "--tensors", "--metrics-address", "127.0.0.1:0",
		"--pyroscope-url", "http://"+lis.Addr().String(), "--pyroscope-interval", "200ms")
	w := startWorkload(t, append([]string{"SIMTORCH_LIB=" + filepath.Join(repoRoot, "build/sim/libc10_cuda.so")}, driver.pyEnv...),
		pythons(t)[2], filepath.Join(repoRoot, "tests/workloads/simwork.py"), "views")
	pid := strconv.Itoa(w.pid)

	target := []string{"--pid", pid, "--library", driver.path}
	file := func(name string) string { return filepath.Join(dir, name) }
	clis := map[string]*cli{
		"pprof":         startCLI(t, append([]string{"record", "--format", "pprof", "-o", file("gpu.pb.gz"), "--top", "3"}, target...)...),
		"folded":        startCLI(t, append([]string{"record", "--format", "folded", "-o", file("driver.folded")}, target...)...),
		"folded tensor": startCLI(t, append([]string{"record", "--format", "folded", "--view", "tensor", "-o", file("tensor.folded")}, target...)...),
		"html":          startCLI(t, append([]string{"record", "--format", "html", "-o", file("gpu.html")}, target...)...),
		"top":           startCLI(t, append([]string{"top", "--interval", "200ms"}, target...)...),
		"agent":         agent,
	}
	for _, c := range clis {
		c.waitEvent(logs.Attached, "kind", "allocator")
		c.waitEvent(logs.Python, "pid", w.pid)
	}
	expect := w.run()
	want := viewTotals{driver: expect["driver_live"], tensor: expect["tensor_live"], reserved: expect["reserved"]}
	if want.driver != 42<<20 || want.reserved != 36<<20 || want.tensor != 2*(12<<20)+600000 {
		t.Fatalf("workload: %v", expect)
	}

	checkMetricsViews(t, clis["agent"].metricsURL(), w.pid, want)
	checkPyroscopeViews(t, r, w.pid, want)
	clis["top"].waitStdout(`^GPU memory \(driver view\): ` + regexp.QuoteMeta(report.HumanBytes(want.driver)) + ` live, `)
	clis["top"].waitStdout(`^tensors \(tensor view\): ` + regexp.QuoteMeta(report.HumanBytes(want.tensor)) + ` live, .*not added to it\)$`)
	for _, c := range clis {
		c.interrupt()
	}
	w.exit()

	checkPprofViews(t, file("gpu.pb.gz"), want)
	for path, bytes := range map[string]uint64{file("driver.folded"): want.driver, file("tensor.folded"): want.tensor} {
		if got := foldedTotal(t, path); got != bytes {
			t.Errorf("%s: %d bytes, want %d", filepath.Base(path), got, bytes)
		}
	}
	checkHTMLViews(t, file("gpu.html"), w.pid, want)
	summary := clis["pprof"].stderr.wait(t, "GPU memory (driver view), stacks", "tensors (tensor view), stacks",
		"GPU memory (driver view): ", "tensors (tensor view): ")
	for i, bytes := range map[int]uint64{2: want.driver, 3: want.tensor} {
		if !strings.Contains(summary[i], ": "+report.HumanBytes(bytes)+" live, ") {
			t.Errorf("--top total %q, want %s live", summary[i], report.HumanBytes(bytes))
		}
	}
}

// checkPprofViews reads the profile with pprof's package and with go tool
// pprof: its default is the driver view, -sample_index=tensor_inuse_space
// the tensor view.
func checkPprofViews(t *testing.T, path string, want viewTotals) {
	t.Helper()
	p := readProfile(t, path)
	totals := map[string]int64{}
	for _, s := range p.Sample {
		for i, st := range p.SampleType {
			totals[st.Type] += s.Value[i]
		}
	}
	if totals["inuse_space"] != int64(want.driver) || totals["tensor_inuse_space"] != int64(want.tensor) || p.DefaultSampleType != "inuse_space" {
		t.Errorf("pprof totals %v, default %s; want inuse_space %d, tensor_inuse_space %d", totals, p.DefaultSampleType, want.driver, want.tensor)
	}
	for _, tc := range []struct {
		flags []string
		bytes uint64
	}{{nil, want.driver}, {[]string{"-sample_index=tensor_inuse_space"}, want.tensor}} {
		args := append(append([]string{"tool", "pprof", "-top", "-unit=B"}, tc.flags...), path)
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("go %v: %v\n%s", args, err, out)
		}
		if !strings.Contains(string(out), fmt.Sprintf(" of %dB total", tc.bytes)) {
			t.Errorf("go tool pprof %v: want %dB total:\n%s", tc.flags, tc.bytes, out)
		}
	}
}

// foldedTotal sums a folded file's bytes.
func foldedTotal(t *testing.T, path string) uint64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var total uint64
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		i := strings.LastIndexByte(line, ' ')
		n, err := strconv.ParseUint(line[i+1:], 10, 64)
		if err != nil {
			t.Fatalf("folded line %q", line)
		}
		total += n
	}
	return total
}

// checkHTMLViews opens the report in Chromium: GPU memory by default, the
// switch to tensors, and the summary of the process on GPU 0.
func checkHTMLViews(t *testing.T, path string, pid int, want viewTotals) {
	t.Helper()
	url := "file://" + path
	for _, tc := range []struct {
		hash, view   string
		root, weight uint64 // the root's bytes; load_weights' bytes
	}{
		// load_weights' three 4 MiB tensors made a 20 MiB segment.
		{"", "driver", want.driver, 20 << 20},
		{"#view=tensor", "tensor", want.tensor, 12 << 20},
	} {
		dom := dumpDOM(t, url+tc.hash)
		if !strings.Contains(dom, `data-view="`+tc.view+`"`) {
			t.Errorf("%q: not the %s view", tc.hash, tc.view)
		}
		if got := frameAttr(t, dom, "root", "all processes", "data-bytes"); got != strconv.FormatUint(tc.root, 10) {
			t.Errorf("%s view: root %s bytes, want %d", tc.view, got, tc.root)
		}
		if got := frameAttr(t, dom, "python", "load_weights", "data-bytes"); got != strconv.FormatUint(tc.weight, 10) {
			t.Errorf("%s view: load_weights %s bytes, want %d", tc.view, got, tc.weight)
		}
		row := regexp.MustCompile(`<tr data-pid="` + strconv.Itoa(pid) + `" data-gpu="0" ([^>]*)>`).FindStringSubmatch(dom)
		wantRow := fmt.Sprintf(`data-held="%d" data-tensors="%d" data-segments="%d" data-graph-pool="0" data-cache="%d"`,
			want.driver, want.tensor, want.reserved, want.reserved-want.tensor)
		if row == nil || row[1] != wantRow {
			t.Errorf("summary row %q, want %s", row, wantRow)
		}
	}
}

// checkMetricsViews scrapes the agent until each view's metric holds the
// process's bytes: gpumem_live_bytes the driver view alone.
func checkMetricsViews(t *testing.T, url string, pid int, want viewTotals) {
	t.Helper()
	sum := func(f map[string]*dto.MetricFamily, name string) uint64 {
		var n float64
		for _, m := range f[name].GetMetric() {
			if metricstest.Labels(m)["pid"] == strconv.Itoa(pid) {
				n += m.GetGauge().GetValue()
			}
		}
		return uint64(n)
	}
	// The breakdown's parts, by category: the cache the segments less the
	// tensors, and every part summed the driver view (no NVML here).
	parts := func(f map[string]*dto.MetricFamily) map[string]uint64 {
		byCategory := map[string]uint64{}
		for _, m := range f["gpumem_breakdown_bytes"].GetMetric() {
			if l := metricstest.Labels(m); l["pid"] == strconv.Itoa(pid) {
				byCategory[l["category"]] += uint64(m.GetGauge().GetValue())
			}
		}
		return byCategory
	}
	exact := func(f map[string]*dto.MetricFamily) bool {
		p := parts(f)
		return sum(f, "gpumem_live_bytes") == want.driver && sum(f, "gpumem_tensor_live_bytes") == want.tensor &&
			sum(f, "gpumem_breakdown_bytes") == want.driver && p["allocator_cache"] == want.reserved-want.tensor
	}
	f := metricstest.ScrapeUntil(t, url, hangLimit, exact)
	if !exact(f) {
		t.Errorf("sum(gpumem_live_bytes) %d, sum(gpumem_tensor_live_bytes) %d, gpumem_breakdown_bytes %v; want %d and %d, summing to the first, the cache %d",
			sum(f, "gpumem_live_bytes"), sum(f, "gpumem_tensor_live_bytes"), parts(f), want.driver, want.tensor, want.reserved-want.tensor)
	}
	for _, m := range f["gpumem_live_bytes"].GetMetric() {
		if metricstest.Labels(m)["kind"] == "tensor" {
			t.Errorf("a tensor series in gpumem_live_bytes: %v", m)
		}
	}
}

// checkPyroscopeViews waits for a push whose profile types, with no label
// filter but the process's pid, hold the process's bytes:
// memory:inuse_space the driver view, memory:tensor_inuse_space the tensor
// view. Nothing is refused. The pid filter: the agent, there before the
// workload, traces the tensors of any process on the shared simulated
// allocator, another package's among them.
func checkPyroscopeViews(t *testing.T, r *pyroscopetest.Receiver, pid int, want viewTotals) {
	t.Helper()
	const driver, tensor = "memory:inuse_space:bytes:space:bytes", "memory:tensor_inuse_space:bytes:space:bytes"
	waitForPush(t, r, pid, fmt.Sprintf("push of %s %d and %s %d", driver, want.driver, tensor, want.tensor), func(totals map[string]int64) bool {
		return totals[driver] == int64(want.driver) && totals[tensor] == int64(want.tensor)
	})
	if refused := r.Refused(); len(refused) != 0 {
		t.Errorf("refused: %v", refused)
	}
}

// waitForPush waits until the totals of pid's series in the receiver's last
// push are what exact says (what: in words), or fails with the last totals.
func waitForPush(t *testing.T, r *pyroscopetest.Receiver, pid int, what string, exact func(map[string]int64) bool) {
	t.Helper()
	waitfor.Value(t, what, hangLimit, func() map[string]int64 {
		pushes := r.Received()
		if len(pushes) == 0 {
			return nil
		}
		push := &pushv1.PushRequest{}
		for _, s := range pushes[len(pushes)-1].Series {
			if pyroscopetest.Labels(s)["pid"] == strconv.Itoa(pid) {
				push.Series = append(push.Series, s)
			}
		}
		totals, err := pyroscopetest.Totals(push)
		if err != nil {
			t.Fatal(err)
		}
		return totals
	}, exact)
}
