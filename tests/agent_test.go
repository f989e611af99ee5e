package tests

import (
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/pyroscope"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
)

// TestAgentStartedBeforeTheWorkload: as a DaemonSet, the agent starts
// before any GPU process, attached to the node's driver library, and
// pushes to the strict receiver, which refuses what Pyroscope v2.2.1
// refuses. Intervals without a process are not pushed at all (Pyroscope
// refuses a push without series); once the workload runs, the pushed
// profiles carry exactly its bytes per function, the six sample types,
// __delta__="false" and the labels, and nothing is ever refused.
func TestAgentStartedBeforeTheWorkload(t *testing.T) {
	r := &pyroscopetest.Receiver{}
	url := serveReceiver(t, r)
	// Without the tensor view: it would trace other tests' simulated
	// PyTorch allocators, running beside this one.
	c, driver := startAgentFirst(t, 4, "--tensors=false", "--pyroscope-url", url,
		"--pyroscope-interval", "300ms", "--node-name", "node-7")
	if n, refused := len(r.Received()), r.Refused(); n != 0 || len(refused) != 0 {
		t.Fatalf("before any process: %d pushes, refused %v", n, refused)
	}

	w := startWorkload(t, driver.env, simwork, "kinds")
	w.run()
	// Allocated: summed over intervals; live: at the last interval's end.
	// The allocation kinds_setup makes before "ready" is traced too: the
	// agent was there first.
	wantAllocated := map[string]int64{
		"alloc_device": 3 << 20, "alloc_pitched": 30720, "alloc_managed": 2 << 20, "alloc_host": 4096 + 8192,
		"alloc_async": 2*65536 + 32768 + 131072, "alloc_pool_ptsz": 16384, "alloc_vmm": 6 << 20, "kinds_setup": 12345,
	}
	wantLive := map[string]int64{
		"alloc_device": 2 << 20, "alloc_pitched": 30720, "alloc_managed": 2 << 20, "alloc_host": 4096,
		"alloc_async": 65536 + 131072, "alloc_pool_ptsz": 0, "alloc_vmm": 4 << 20, "kinds_setup": 0,
	}
	exact := func() bool {
		allocated, live, _ := workloadBytes(t, r.Received(), w.pid)
		return maps.Equal(allocated, wantAllocated) && maps.Equal(live, wantLive)
	}
	waitfor.Condition(t, "the workload's bytes pushed", hangLimit, exact)
	// And they stay so: later intervals allocate nothing and see the same
	// memory live.
	_, _, pushes := workloadBytes(t, r.Received(), w.pid)
	waitfor.Condition(t, "two more pushes", hangLimit, func() bool {
		_, _, n := workloadBytes(t, r.Received(), w.pid)
		return n >= pushes+2
	})
	if allocated, live, _ := workloadBytes(t, r.Received(), w.pid); !maps.Equal(allocated, wantAllocated) || !maps.Equal(live, wantLive) {
		t.Errorf("allocated %v live %v, want %v and %v", allocated, live, wantAllocated, wantLive)
	}
	checkSeries(t, r.Received(), w.pid)
	if refused := r.Refused(); len(refused) != 0 {
		t.Errorf("receiver refused %v", refused)
	}
	line := waitLines(t, c, "status: 1 processes")[0]
	if !strings.Contains(line, " 0 failed 0 rejected 0 dropped") {
		t.Errorf("status %q", line)
	}
	c.interrupt()
	w.exit()
}

// agentDriver is an agent's own copy of the simulated driver: a private
// inode, which only the workloads started with its env load, so that the
// processes of other tests, of other packages or of another run of the
// suite never reach that agent's driver view.
type agentDriver struct {
	path  string   // the copy, the agent's --library
	env   []string // for simwork: the copy's folder, searched before its RUNPATH
	pyEnv []string // for simwork.py: the copy, as SIMCUDA_LIB (the simulated allocator then uses it, already loaded)
}

// startAgentFirst starts `gpumem agent --library COPY args...` as a
// DaemonSet starts it, before any GPU process, on a copy of the simulated
// driver, and waits until it has logged intervals status lines counting no
// process, a status line every 200ms unless args say otherwise. Workloads started with the copy's env are traced from their
// first call. With --tensors=false, every status line before must count no
// process, and nothing pushed; with the tensor view, a line may count
// another package's process (the allocator probes attach to the shared
// simulated allocator in any process that maps it) and is then not
// counted.
func startAgentFirst(t *testing.T, intervals int, args ...string) (*cli, agentDriver) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "driver")
	d := agentDriver{path: filepath.Join(dir, "libcuda.so.1")}
	copyFile(t, simLib, d.path)
	d.env = []string{"LD_LIBRARY_PATH=" + dir}
	d.pyEnv = []string{"SIMCUDA_LIB=" + d.path}
	c := startCLI(t, append([]string{"agent", "--library", d.path, "--status-interval", "200ms"}, args...)...)
	c.waitEvent(logs.Attached, "library", d.path)
	tensors := !slices.Contains(args, "--tensors=false")
	for idle := 0; idle < intervals; {
		line := waitLines(t, c, "status:")[0]
		switch {
		case strings.Contains(line, "status: 0 processes") && (tensors || !strings.Contains(line, "pushes ") ||
			strings.Contains(line, "pushes 0 done 0 failed 0 rejected 0 dropped 0 queued")):
			idle++
		case !tensors:
			t.Fatalf("status before any process: %q", line)
		}
	}
	return c, d
}

// workloadBytes reads pid's series back from the pushes: bytes allocated
// per function, summed over the intervals; bytes live per function at the
// last push; and how many pushes held the process.
func workloadBytes(t *testing.T, pushes []*pushv1.PushRequest, pid int) (allocated, live map[string]int64, n int) {
	t.Helper()
	allocated = map[string]int64{}
	for _, req := range pushes {
		inuse := map[string]int64{}
		found := false
		for _, series := range req.Series {
			if l := pyroscopetest.Labels(series); l["pid"] != strconv.Itoa(pid) || l[pyroscope.LabelName] != pyroscope.ProfileName {
				continue // another process's, or its malloc series
			}
			found = true
			for _, s := range parseSeries(t, series).Sample {
				fn := s.Location[1].Line[0].Function.Name
				allocated[fn] += s.Value[1]
				inuse[fn] += s.Value[3]
			}
		}
		if found {
			live, n = inuse, n+1
		}
	}
	// A function whose memory is all freed is in no later profile.
	for fn := range allocated {
		if _, ok := live[fn]; !ok && live != nil {
			live[fn] = 0
		}
	}
	return allocated, live, n
}

// checkSeries checks the labels and sample types of pid's series.
func checkSeries(t *testing.T, pushes []*pushv1.PushRequest, pid int) {
	t.Helper()
	want := map[string]string{"__name__": "memory", "__delta__": "false", "service_name": "simwork",
		"pid": strconv.Itoa(pid), "comm": "simwork", "node": "node-7"}
	for _, req := range pushes {
		for _, series := range req.Series {
			labels := pyroscopetest.Labels(series)
			if labels["pid"] != strconv.Itoa(pid) || labels[pyroscope.LabelName] != pyroscope.ProfileName {
				continue
			}
			for k, v := range want {
				if labels[k] != v {
					t.Fatalf("label %s=%q, want %q (all: %v)", k, labels[k], v, labels)
				}
			}
			p := parseSeries(t, series)
			var types []string
			for _, st := range p.SampleType {
				types = append(types, st.Type)
			}
			if strings.Join(types, ",") != "alloc_objects,alloc_space,inuse_objects,inuse_space,peak_objects,peak_space" {
				t.Fatalf("sample types %v", types)
			}
			for _, s := range p.Sample {
				if s.Label["kind"][0] != labels["kind"] {
					t.Errorf("sample kind %v in series %v", s.Label["kind"], labels["kind"])
				}
			}
		}
	}
}

func parseSeries(t *testing.T, series *pushv1.RawProfileSeries) *profile.Profile {
	t.Helper()
	p, err := profile.ParseData(series.Samples[0].RawProfile)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAgentRejectedPushes: a service name longer than Pyroscope takes
// (2048 bytes) has every push refused for its content. Each is dropped at
// once, none is queued or retried, tracing goes on; the status line counts
// the rejections and says why once; the metrics count them by reason.
func TestAgentRejectedPushes(t *testing.T) {
	r := &pyroscopetest.Receiver{}
	url := serveReceiver(t, r)
	// Without the tensor view: another package's process on the simulated
	// allocator would count in the status line's processes.
	c, driver := startAgentFirst(t, 3, "--tensors=false", "--pyroscope-url", url, "--pyroscope-interval", "200ms",
		"--service-name", strings.Repeat("s", 3000), "--metrics-address", "127.0.0.1:0")
	metrics := c.metricsURL()
	w := startWorkload(t, driver.env, simwork, "hold", "4096")
	w.run()

	reasons := 0
	for {
		line := waitLines(t, c, "status:")[0]
		if strings.Contains(line, "last rejection:") {
			reasons++
			if !strings.Contains(line, "last rejection: InvalidArgument: ") || !strings.Contains(line, "label value too long") {
				t.Errorf("status %q", line)
			}
		}
		counts := pushCounts(t, line)
		if counts["rejected"] < 3 {
			continue
		}
		if counts["done"] != 0 || counts["failed"] != 0 || counts["dropped"] != 0 || !strings.Contains(line, "status: 1 processes") {
			t.Errorf("status %q", line)
		}
		break
	}
	if reasons != 1 {
		t.Errorf("the reason said on %d lines, want 1", reasons)
	}
	families := metricstest.ScrapeUntil(t, metrics, hangLimit, func(f map[string]*dto.MetricFamily) bool {
		return len(f["gpumem_pyroscope_rejected_total"].GetMetric()) > 0 &&
			f["gpumem_pyroscope_rejected_total"].GetMetric()[0].GetCounter().GetValue() >= 3
	})
	rejected := families["gpumem_pyroscope_rejected_total"].GetMetric()
	if len(rejected) != 1 || metricstest.Labels(rejected[0])["reason"] != "InvalidArgument" {
		t.Errorf("rejected %v", rejected)
	}
	for _, name := range []string{"gpumem_pyroscope_pushed_total", "gpumem_pyroscope_push_failures_total"} {
		if m := families[name].GetMetric(); len(m) != 1 || m[0].GetCounter().GetValue() != 0 {
			t.Errorf("%s %v, want 0", name, m)
		}
	}
	for _, m := range families["gpumem_pyroscope_dropped_total"].GetMetric() {
		if m.GetCounter().GetValue() != 0 {
			t.Errorf("dropped %v", m)
		}
	}
	if n := len(r.Received()); n != 0 {
		t.Errorf("%d pushes accepted", n)
	}
	for _, err := range r.Refused() {
		if !strings.Contains(err.Error(), "label value too long") {
			t.Errorf("refused for %v", err)
		}
	}
	c.interrupt()
	w.exit()
}

// TestAgentWhileReceiverIsDown: nothing listens at the URL. Tracing goes on,
// the status line says what fails, full-queue drops are counted, and the
// agent's memory stays bounded.
func TestAgentWhileReceiverIsDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()

	c, driver := startAgentFirst(t, 3, "--tensors=false", "--pyroscope-url", "http://"+addr,
		"--pyroscope-interval", "200ms", "--pyroscope-queue", "3")
	w := startWorkload(t, driver.env, simwork, "threads", "4", "5", "2000")
	w.run()
	for range 3 {
		waitLines(t, c, "status:")
	}
	rss := residentKiB(t, c.cmd.Process.Pid)
	var status string
	for !strings.Contains(status, "dropped") || strings.Contains(status, " 0 dropped") {
		status = waitLines(t, c, "status:")[0]
	}
	if !strings.Contains(status, "0 done") || !strings.Contains(status, "0 rejected") ||
		!strings.Contains(status, "last error:") || !strings.Contains(status, "3 queued") {
		t.Errorf("status %q", status)
	}
	if rss > 150<<10 {
		t.Errorf("agent resident memory %d KiB", rss)
	}
	c.interrupt()
	w.exit()
}

var pushCountsRE = regexp.MustCompile(`pushes (\d+) done (\d+) failed (\d+) rejected (\d+) dropped (\d+) queued`)

// pushCounts reads the exporter's counts from a status line.
func pushCounts(t *testing.T, line string) map[string]int {
	t.Helper()
	m := pushCountsRE.FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no push counts in %q", line)
	}
	counts := map[string]int{}
	for i, name := range []string{"done", "failed", "rejected", "dropped", "queued"} {
		counts[name], _ = strconv.Atoi(m[i+1])
	}
	return counts
}

// serveReceiver serves r on a loopback port and returns its URL.
func serveReceiver(t *testing.T, r *pyroscopetest.Receiver) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pyroscopetest.Serve(t, r, lis)
	return "http://" + lis.Addr().String()
}

// waitLines reads the agent's stderr, line by line, until it has seen a
// line containing each of wants (in any order), and returns them.
func waitLines(t *testing.T, c *cli, wants ...string) []string {
	t.Helper()
	found := make([]string, len(wants))
	missing := len(wants)
	deadline := time.After(hangLimit)
	for missing > 0 {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("agent exited before saying %q", wants)
			}
			for i, want := range wants {
				if found[i] == "" && strings.Contains(line, want) {
					found[i] = line
					missing--
					break
				}
			}
		case <-deadline:
			t.Fatalf("agent did not say %q within %v", wants, hangLimit)
		}
	}
	return found
}

func residentKiB(t *testing.T, pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
