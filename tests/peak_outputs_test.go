package tests

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/pprof"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/report"
)

// peakKey names a peak: one process's memory on one GPU in one view.
type peakKey struct {
	pid  int
	gpu  string
	view memory.View
}

// peakWant is what a peak must be: its bytes and each function's share (the
// function as report.HottestFrame names it: the innermost Python frame,
// else the caller of the driver), what the process holds now (live, for
// the outputs that show both), and spike, a function whose bytes at the
// peak must be gone by the interval's end ("" for no such check).
type peakWant struct {
	peakKey
	bytes uint64
	by    map[string]uint64
	live  uint64
	spike string
}

// top is the function holding the most at the peak.
func (w peakWant) top() (string, uint64) {
	var fn string
	var most uint64
	for name, bytes := range w.by {
		if bytes > most || (bytes == most && name < fn) {
			fn, most = name, bytes
		}
	}
	return fn, most
}

// peakSeen is a peak as an output shows it: bytes by function, and the
// live bytes by function beside it (pprof and Pyroscope carry both).
type peakSeen struct {
	bytes uint64
	by    map[string]uint64
	live  map[string]uint64
}

func (s *peakSeen) matches(w peakWant) bool {
	return s != nil && s.bytes == w.bytes && maps.Equal(s.by, w.by) && (w.spike == "" || s.live[w.spike] == 0)
}

func (s *peakSeen) String() string {
	if s == nil {
		return "none"
	}
	return fmt.Sprintf("%d bytes by %v, live by %v", s.bytes, s.by, s.live)
}

// TestPeakInEveryOutput: two processes, started after the agent (there
// first, as a DaemonSet) and before the recorders attach, traced by every
// output at once: simwork's spike scenario on two GPUs
// (a spike on GPU 1 freed at once, then a higher one from another function)
// and a PyTorch-shaped process on the simulated allocator (weights held, a
// spike of activation tensors freed and the allocator's cache emptied
// before any report). Each output carries each peak exactly, total and per
// function, each view apart: record's pprof (peak_space,
// tensor_peak_space, read by pprof's package and go tool pprof), JSON
// peaks, folded --value peak per view, --top's peaks beside the live
// bytes; the agent's interval peaks in Prometheus (gpumem_peak_bytes,
// gpumem_tensor_peak_bytes) and in its Pyroscope pushes (memory:peak_space,
// memory:tensor_peak_space), where the spike's function holds the peak but
// nothing live at the interval's end, and the next interval's peak is the
// level held; and gpumem top's table of peaks.
func TestPeakInEveryOutput(t *testing.T) {
	const MiB = 1 << 20
	dir := t.TempDir()
	started := time.Now()
	r := &pyroscopetest.Receiver{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pyroscopetest.Serve(t, r, lis)
	// The agent first, as a DaemonSet, on its own driver; the recorders
	// after, of the two processes. Intervals long enough for a scrape to
	// find each interval's gauge.
	agentCLI, driver := startAgentFirst(t, 2, "--tensors", "--metrics-address", "127.0.0.1:0",
		"--pyroscope-url", "http://"+lis.Addr().String(), "--pyroscope-interval", "2s")
	c := startWorkload(t, append([]string{"SIMCUDA_DEVICES=2"}, driver.env...), simwork, "spike")
	py := startWorkload(t, append([]string{"SIMTORCH_LIB=" + filepath.Join(repoRoot, "build/sim/libc10_cuda.so")}, driver.pyEnv...),
		pythons(t)[2], filepath.Join(repoRoot, "tests/workloads/simwork.py"), "tensor_spike")

	target := []string{"--pid", fmt.Sprintf("%d,%d", c.pid, py.pid), "--library", driver.path}
	file := func(name string) string { return filepath.Join(dir, name) }
	record := func(args ...string) *cli {
		return startCLI(t, append(append([]string{"record"}, args...), target...)...)
	}
	clis := map[string]*cli{
		"pprof":         record("--format", "pprof", "-o", file("gpu.pb.gz"), "--top", "5"),
		"json":          record("--format", "json", "-o", file("gpu.json"), "--top", "0"),
		"folded driver": record("--format", "folded", "--value", "peak", "-o", file("driver.folded"), "--top", "0"),
		"folded tensor": record("--format", "folded", "--value", "peak", "--view", "tensor", "-o", file("tensor.folded"), "--top", "0"),
		"top":           startCLI(t, append([]string{"top", "--interval", "200ms"}, target...)...),
		"agent":         agentCLI,
	}
	for _, cl := range clis {
		cl.waitEvent(logs.Attached, "kind", "allocator")
		cl.waitEvent(logs.Python, "pid", py.pid)
	}
	agent := agentPeaks{t: t, url: clis["agent"].metricsURL(), r: r}

	// The agent: each interval's peak, the spike in its interval, the
	// level held in the intervals after.
	gpu1 := func(bytes uint64, by map[string]uint64, spike string) peakWant {
		return peakWant{peakKey: peakKey{c.pid, "1", memory.ViewDriver}, bytes: bytes, by: by, spike: spike}
	}
	first := c.run()
	agent.wait(gpu1(first["gpu1_peak"], map[string]uint64{"spike_base": first["gpu1_base"], "first_spike": first["first_spike"]}, "first_spike"))
	second := c.run()
	higher := gpu1(second["gpu1_peak"], map[string]uint64{"spike_base": second["gpu1_base"], "higher_spike": second["higher_spike"]}, "higher_spike")
	agent.wait(higher)
	agent.wait(gpu1(second["gpu1_base"], map[string]uint64{"spike_base": second["gpu1_base"]}, ""))

	spike := py.run()
	if spike["tensor_peak"] != 42*MiB || spike["allocated_peak"] != spike["tensor_peak"] || spike["reserved_peak"] != 60*MiB {
		t.Fatalf("workload: %v", spike)
	}
	pyPeak := func(view memory.View, bytes uint64, by map[string]uint64, live uint64, spike string) peakWant {
		return peakWant{peakKey: peakKey{py.pid, "0", view}, bytes: bytes, by: by, live: live, spike: spike}
	}
	tensors := pyPeak(memory.ViewTensor, spike["tensor_peak"],
		map[string]uint64{"load_weights": spike["peak_load_weights"], "activation_spike": spike["peak_activation_spike"]}, spike["tensor_live"], "activation_spike")
	// The allocator's segments: a 20 MiB one that load_weights grew, two
	// that activation_spike grew, emptied (the cache emptied at once: so
	// soon that an interval may end between, which the driver view's spike
	// check would not survive).
	segments := pyPeak(memory.ViewDriver, spike["reserved_peak"],
		map[string]uint64{"load_weights": 20 * MiB, "activation_spike": 40 * MiB}, spike["reserved"], "")
	agent.wait(tensors, segments)

	// The run's peaks, in record and top.
	higher.live = second["gpu1_base"]
	gpu0 := peakWant{peakKey: peakKey{c.pid, "0", memory.ViewDriver}, bytes: second["gpu0_base"],
		by: map[string]uint64{"spike_base": second["gpu0_base"]}, live: second["gpu0_base"]}
	run := []peakWant{gpu0, higher, segments, tensors}
	comms := map[int]string{c.pid: "simwork", py.pid: filepath.Base(pythons(t)[2])}
	for _, w := range run {
		clis["top"].waitStdout(topPeakLine(w, comms[w.pid]))
	}
	for _, cl := range clis {
		cl.interrupt()
	}
	c.exit()
	py.exit()

	checkPprofPeaks(t, file("gpu.pb.gz"), run)
	checkJSONPeaks(t, file("gpu.json"), run, started)
	for view, path := range map[memory.View]string{memory.ViewDriver: file("driver.folded"), memory.ViewTensor: file("tensor.folded")} {
		checkFoldedPeaks(t, path, view, run, comms)
	}
	checkTopPeaks(t, clis["pprof"].stderr, run, comms)
	if refused := r.Refused(); len(refused) != 0 {
		t.Errorf("pushes refused: %v", refused)
	}
}

// agentPeaks watches an agent's interval peaks: its gauges and its pushes.
type agentPeaks struct {
	t   *testing.T
	url string
	r   *pyroscopetest.Receiver
}

// wait waits until each of wants was an interval's peak in the gauges at
// some scrape (each gauge holds an interval's peak for one interval), then
// in a push: its total, each function's share, and its spike's function
// holding nothing live at the interval's end.
func (a agentPeaks) wait(wants ...peakWant) {
	a.t.Helper()
	seen := map[peakKey]bool{}
	last := map[peakKey]float64{}
	metricstest.ScrapeUntil(a.t, a.url, hangLimit, func(f map[string]*dto.MetricFamily) bool {
		all := true
		for _, w := range wants {
			last[w.peakKey] = peakGauge(f, w.peakKey)
			seen[w.peakKey] = seen[w.peakKey] || last[w.peakKey] == float64(w.bytes)
			all = all && seen[w.peakKey]
		}
		return all
	})
	for _, w := range wants {
		if !seen[w.peakKey] {
			a.t.Errorf("gauge of %+v: %v at the last scrape, never %d", w.peakKey, last[w.peakKey], w.bytes)
		}
	}
	for _, w := range wants {
		waitfor.Value(a.t, fmt.Sprintf("push of %+v: %d bytes by %v, %q holding none live", w.peakKey, w.bytes, w.by, w.spike), hangLimit,
			func() *peakSeen { return a.pushed(w) }, func(got *peakSeen) bool { return got.matches(w) })
	}
}

// pushed is the peak of w's process, GPU and view in the first push that
// matches w, else in the last push that has it.
func (a agentPeaks) pushed(w peakWant) *peakSeen {
	var last *peakSeen
	for _, req := range a.r.Received() {
		all := map[peakKey]*peakSeen{}
		for _, s := range req.Series {
			p, err := profile.ParseData(s.Samples[0].RawProfile)
			if err != nil {
				a.t.Fatal(err)
			}
			addProfilePeaks(all, p)
		}
		if got, ok := all[w.peakKey]; ok {
			if last = got; got.matches(w) {
				return got
			}
		}
	}
	return last
}

// peakGauge is the gauge of a process's peak on a GPU in a view.
func peakGauge(f map[string]*dto.MetricFamily, k peakKey) float64 {
	name := "gpumem_peak_bytes"
	if k.view == memory.ViewTensor {
		name = "gpumem_tensor_peak_bytes"
	}
	for _, m := range f[name].GetMetric() {
		if l := metricstest.Labels(m); l["pid"] == strconv.Itoa(k.pid) && l["gpu"] == k.gpu {
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// addProfilePeaks adds a profile's peak and live sample types to peaks,
// by the pid and gpu labels of its samples and by function.
func addProfilePeaks(peaks map[peakKey]*peakSeen, p *profile.Profile) {
	column := map[string]int{}
	for i, st := range p.SampleType {
		column[st.Type] = i
	}
	for _, s := range p.Sample {
		fn := profileHottest(s)
		for _, v := range memory.Views {
			peak, ok := column[pprof.PeakSampleType(v)]
			if !ok {
				continue
			}
			live := column[pprof.DefaultSampleType(v)]
			if s.Value[peak] == 0 && s.Value[live] == 0 {
				continue
			}
			k := peakKey{int(s.NumLabel["pid"][0]), s.Label["gpu"][0], v}
			seen := peaks[k]
			if seen == nil {
				seen = &peakSeen{by: map[string]uint64{}, live: map[string]uint64{}}
				peaks[k] = seen
			}
			seen.bytes += uint64(s.Value[peak])
			if s.Value[peak] > 0 {
				seen.by[fn] += uint64(s.Value[peak])
			}
			seen.live[fn] += uint64(s.Value[live])
		}
	}
}

// profileHottest names a sample's function as report.HottestFrame does:
// the innermost Python frame (the one with a line), else the driver's
// caller.
func profileHottest(s *profile.Sample) string {
	for _, loc := range s.Location {
		if loc.Line[0].Line != 0 {
			return loc.Line[0].Function.Name
		}
	}
	if len(s.Location) > 1 {
		return s.Location[1].Line[0].Function.Name
	}
	return "?"
}

// checkPprofPeaks reads record's profile with pprof's package, each peak's
// total and shares under its view's peak sample type, and with go tool
// pprof, whose -sample_index=peak_space total is the driver view's peaks.
func checkPprofPeaks(t *testing.T, path string, wants []peakWant) {
	t.Helper()
	p := readProfile(t, path)
	got := map[peakKey]*peakSeen{}
	addProfilePeaks(got, p)
	totals := map[memory.View]uint64{}
	for _, w := range wants {
		totals[w.view] += w.bytes
		if s := got[w.peakKey]; !s.matches(w) {
			t.Errorf("pprof: %+v: %s; want %d bytes by %v", w.peakKey, s, w.bytes, w.by)
		}
	}
	for v, bytes := range totals {
		args := []string{"tool", "pprof", "-top", "-unit=B", "-sample_index=" + pprof.PeakSampleType(v), path}
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("go %v: %v\n%s", args, err, out)
		}
		if !strings.Contains(string(out), fmt.Sprintf(" of %dB total", bytes)) {
			t.Errorf("go tool pprof -sample_index=%s: want %dB total:\n%s", pprof.PeakSampleType(v), bytes, out)
		}
	}
}

type jsonFrame struct{ Function, File string }

// checkJSONPeaks reads record's JSON peaks: each with its view, total,
// allocations and stacks, reached after the test started.
func checkJSONPeaks(t *testing.T, path string, wants []peakWant, started time.Time) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Time  time.Time
		Peaks []struct {
			PID         int
			GPU, View   string
			Time        time.Time
			Bytes       uint64
			Allocations uint64
			Stacks      []struct {
				Frames             []jsonFrame
				Bytes, Allocations uint64
			}
		}
	}
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	got := map[peakKey]*peakSeen{}
	for _, pk := range out.Peaks {
		view, _ := memory.ParseView(pk.View)
		seen := &peakSeen{bytes: pk.Bytes, by: map[string]uint64{}}
		var allocations uint64
		for _, s := range pk.Stacks {
			fn := "?" // as report.HottestFrame
			if len(s.Frames) > 1 {
				fn = s.Frames[1].Function
			}
			if i := slices.IndexFunc(s.Frames, func(f jsonFrame) bool { return f.File != "" }); i >= 0 {
				fn = s.Frames[i].Function
			}
			seen.by[fn] += s.Bytes
			allocations += s.Allocations
		}
		if allocations != pk.Allocations || pk.Time.Before(started) || pk.Time.After(out.Time) {
			t.Errorf("JSON peak %+v: stacks' allocations %d, time not between %v and %v", pk, allocations, started, out.Time)
		}
		got[peakKey{pk.PID, pk.GPU, view}] = seen
	}
	for _, w := range wants {
		if s := got[w.peakKey]; !s.matches(w) {
			t.Errorf("JSON: %+v: %s; want %d bytes by %v", w.peakKey, s, w.bytes, w.by)
		}
	}
}

// checkFoldedPeaks reads folded --value peak of one view: each process's
// lines on a GPU sum to its peak there, each function's to its share.
func checkFoldedPeaks(t *testing.T, path string, view memory.View, wants []peakWant, comms map[int]string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	sum := func(prefix, fn string) uint64 {
		var n uint64
		for _, line := range lines {
			i := strings.LastIndexByte(line, ' ')
			bytes, err := strconv.ParseUint(line[i+1:], 10, 64)
			if err != nil {
				t.Fatalf("folded line %q", line)
			}
			if strings.HasPrefix(line, prefix) && (fn == "" || strings.Contains(line[:i]+";", ";"+fn+";")) {
				n += bytes
			}
		}
		return n
	}
	for _, w := range wants {
		if w.view != view {
			continue
		}
		prefix := comms[w.pid] + ";gpu=" + w.gpu + ";"
		got := &peakSeen{bytes: sum(prefix, ""), by: map[string]uint64{}}
		for fn := range w.by {
			got.by[fn] = sum(prefix, fn)
		}
		if !got.matches(w) {
			t.Errorf("%s: %s: %s; want %d bytes by %v", filepath.Base(path), prefix, got, w.bytes, w.by)
		}
	}
}

// checkTopPeaks finds each peak in record --top's summary, under its
// view's heading: when, its bytes beside what is live now, and the
// function that held the most.
func checkTopPeaks(t *testing.T, stderr *logBook, wants []peakWant, comms map[int]string) {
	t.Helper()
	stderr.mu.Lock()
	lines := slices.Clone(stderr.lines)
	stderr.mu.Unlock()
	for _, w := range wants {
		heading := report.ViewName(w.view) + ", peaks ("
		fn, most := w.top()
		re := regexp.MustCompile(`^` + regexp.QuoteMeta(report.HumanBytes(w.bytes)) + ` peak at \d\d:\d\d:\d\d\.\d{3}, pid ` +
			strconv.Itoa(w.pid) + ` \(` + regexp.QuoteMeta(comms[w.pid]) + `\), gpu ` + w.gpu + ` \(` +
			regexp.QuoteMeta(report.HumanBytes(w.live)) + ` live now\); most \(` + regexp.QuoteMeta(report.HumanBytes(most)) +
			`\) by ` + regexp.QuoteMeta(fn) + `$`)
		found, under := false, false
		for _, line := range lines {
			switch {
			case strings.Contains(line, ", peaks ("):
				under = strings.HasPrefix(line, heading)
			case strings.Contains(line, "stacks holding the most"):
				under = false
			case under && re.MatchString(line):
				found = true
			}
		}
		if !found {
			t.Errorf("record --top: no line %q under %q:\n%s", re, heading, strings.Join(lines, "\n"))
		}
	}
}

// topPeakLine is the pattern of a peak's row in gpumem top's table of
// peaks.
func topPeakLine(w peakWant, comm string) string {
	fn, most := w.top()
	return `^\s*` + strconv.Itoa(w.pid) + `\s+` + regexp.QuoteMeta(comm) + `\s+-\s+` + w.gpu + `\s+` + w.view.String() + `\s+` +
		regexp.QuoteMeta(report.HumanBytes(w.live)) + `\s+` + regexp.QuoteMeta(report.HumanBytes(w.bytes)) +
		`\s+\d\d:\d\d:\d\d\.\d{3}\s+` + regexp.QuoteMeta(fn) + ` \(` + regexp.QuoteMeta(report.HumanBytes(most)) + `\)$`
}
