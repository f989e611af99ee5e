package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/schema"
)

// cli is a running gpumem command whose stderr is watched.
type cli struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdout syncBuffer
	stderr *logBook
	lines  chan string // stderr's sentences, for tests that read them in turn
}

// jsonLog is the flag that has a gpumem command log events, which the
// tests wait for.
const jsonLog = "--log-format=json"

func startCLI(t *testing.T, args ...string) *cli {
	t.Helper()
	return startCommandLine(t, exec.Command(gpumem, append([]string{jsonLog}, args...)...))
}

// startCommandLine starts cmd, a gpumem command line (run through another
// command, such as setpriv) that logs in JSON (jsonLog).
func startCommandLine(t *testing.T, cmd *exec.Cmd) *cli {
	t.Helper()
	c := &cli{t: t, cmd: cmd, stderr: newLogBook(), lines: make(chan string, 1<<16)}
	c.cmd.Stdout = &c.stdout
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := readLogLine(t, sc.Text())
			t.Log("gpumem: " + line.Msg)
			c.stderr.add(line)
			c.lines <- line.Msg
		}
		c.stderr.end()
		close(c.lines)
	}()
	t.Cleanup(func() { c.cmd.Process.Kill(); c.cmd.Wait() })
	return c
}

// waitStderr waits for a line of stderr containing want, said before the
// call or after.
func (c *cli) waitStderr(want string) {
	c.t.Helper()
	c.stderr.wait(c.t, want)
}

// waitEvent waits for the event name whose fields hold wants (key-value
// pairs), logged before the call or after, and returns its fields.
func (c *cli) waitEvent(name string, wants ...any) map[string]any {
	c.t.Helper()
	return c.stderr.waitEvent(c.t, name, wants...)
}

// metricsURL waits for the agent's metrics endpoint and returns its URL.
func (c *cli) metricsURL() string {
	c.t.Helper()
	return fmt.Sprintf("http://%s/metrics", c.waitEvent(logs.ServingMetrics)["address"])
}

// readLogLine reads a line of stderr: gpumem's, a JSON object whose time,
// level and sentence must be there, or another program's (a command that
// record runs), kept as it is.
func readLogLine(t *testing.T, text string) logs.Line {
	if !strings.HasPrefix(text, `{"time":`) {
		return logs.Line{Msg: text}
	}
	line, err := logs.Parse(text)
	if err != nil {
		t.Error(err)
		return logs.Line{Msg: text}
	}
	return line
}

// waitStdout waits until stdout matches pattern (a regular expression, per
// line) and returns it.
func (c *cli) waitStdout(pattern string) string {
	c.t.Helper()
	return waitfor.Value(c.t, fmt.Sprintf("output matching %q", pattern), hangLimit, c.stdout.String,
		func(out string) bool { return matchLine(out, pattern) })
}

// syncBuffer is a bytes.Buffer that a command writes while a test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// interrupt stops the command as Ctrl-C would and waits for it.
func (c *cli) interrupt() {
	c.t.Helper()
	c.cmd.Process.Signal(os.Interrupt)
	if err := c.cmd.Wait(); err != nil {
		c.t.Fatalf("gpumem: %v", err)
	}
}

// recordKinds records the kinds scenario with the given output flags.
func recordKinds(t *testing.T, args ...string) (pid int) {
	w := startWorkload(t, nil, simwork, "kinds")
	c := startCLI(t, append([]string{"record", "--pid", strconv.Itoa(w.pid)}, args...)...)
	c.waitEvent(logs.Attached, "kind", "driver")
	w.run()
	c.interrupt()
	w.exit()
	return w.pid
}

func TestRecordPprof(t *testing.T) {
	out := filepath.Join(t.TempDir(), "gpu.pb.gz")
	recordKinds(t, "--format", "pprof", "-o", out)

	// Read back with pprof's own package: exact values per function.
	p := readProfile(t, out)
	var types []string
	for _, st := range p.SampleType {
		types = append(types, st.Type+"/"+st.Unit)
	}
	// The driver view under Go heap profiles' types (inuse_space the
	// default) and its peak's, the tensor view under its own, empty
	// without PyTorch.
	if got := strings.Join(types, " "); got != "alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes "+
		"peak_objects/count peak_space/bytes tensor_alloc_objects/count tensor_alloc_space/bytes tensor_inuse_objects/count "+
		"tensor_inuse_space/bytes tensor_peak_objects/count tensor_peak_space/bytes" || p.DefaultSampleType != "inuse_space" {
		t.Errorf("sample types %s, default %s", got, p.DefaultSampleType)
	}
	inuse := map[string]int64{}
	for _, s := range p.Sample {
		inuse[s.Location[1].Line[0].Function.Name] += s.Value[3]
		if s.Label["kind"] == nil || s.Label["comm"][0] != "simwork" || s.NumLabel["pid"] == nil {
			t.Errorf("labels %v %v", s.Label, s.NumLabel)
		}
	}
	want := map[string]int64{
		"alloc_device": 2 << 20, "alloc_pitched": 30720, "alloc_managed": 2 << 20, "alloc_host": 4096,
		"alloc_async": 65536 + 131072, "alloc_pool_ptsz": 0, "alloc_vmm": 4 << 20,
	}
	for fn, bytes := range want {
		if inuse[fn] != bytes {
			t.Errorf("%s: inuse %d, want %d", fn, inuse[fn], bytes)
		}
	}

	// And with go tool pprof, as a user would.
	top, err := exec.Command("go", "tool", "pprof", "-top", "-cum", "-unit=B", out).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof: %v\n%s", err, top)
	}
	for _, want := range []string{
		" 2097152B .* alloc_device$", " 4194304B .* alloc_vmm$", " 196608B .* alloc_async$",
		" 4194304B .* cuMemCreate$", " 8620032B .* kinds$",
	} {
		if !matchLine(string(top), want) {
			t.Errorf("pprof -top has no line matching %q:\n%s", want, top)
		}
	}
}

func TestRecordFolded(t *testing.T) {
	out := filepath.Join(t.TempDir(), "gpu.folded")
	recordKinds(t, "--format", "folded", "--value", "alloc", "-o", out)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		stack, value, ok := strings.Cut(line, " ")
		n, err := strconv.Atoi(value)
		if !ok || err != nil || !strings.HasPrefix(stack, "simwork;gpu=") {
			t.Fatalf("bad folded line %q", line)
		}
		frames := strings.Split(stack, ";")
		sums[strings.Join(frames[len(frames)-3:], ";")] += n
	}
	for stack, bytes := range map[string]int{
		"kinds;alloc_device;cuMemAlloc_v2":       3 << 20,
		"kinds;alloc_vmm;cuMemCreate":            6 << 20,
		"kinds;alloc_host;cuMemHostAlloc":        8192,
		"kinds;alloc_pitched;cuMemAllocPitch_v2": 30720,
	} {
		if sums[stack] != bytes {
			t.Errorf("%s: %d, want %d\n%s", stack, sums[stack], bytes, data)
		}
	}
}

func TestRecordJSON(t *testing.T) {
	out := filepath.Join(t.TempDir(), "gpu.json")
	pid := recordKinds(t, "--format", "json", "-o", out)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Stacks []struct {
			PID            int    `json:"pid"`
			Kind           string `json:"kind"`
			Frames         []struct{ Function string }
			AllocatedBytes uint64 `json:"allocated_bytes"`
			FreedBytes     uint64 `json:"freed_bytes"`
			LiveBytes      uint64 `json:"live_bytes"`
		}
		Losses map[string]uint64
		Ledger struct {
			UnknownFrees   uint64            `json:"unknown_frees"`
			UnknownFreesBy map[string]uint64 `json:"unknown_frees_by"`
		}
	}
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	var live uint64
	kinds := map[string]bool{}
	for _, s := range r.Stacks {
		if s.PID != pid || s.AllocatedBytes-s.FreedBytes != s.LiveBytes {
			t.Errorf("stack %+v", s)
		}
		live += s.LiveBytes
		kinds[s.Kind] = true
	}
	if live != 8620032 || len(kinds) != 4 {
		t.Errorf("live %d, kinds %v", live, kinds)
	}
	// The free of memory allocated before recording, and the free the
	// driver refuses.
	if r.Ledger.UnknownFrees != 2 || r.Ledger.UnknownFreesBy["cuMemFree_v2"] != 2 {
		t.Errorf("ledger %+v", r.Ledger)
	}
	for l := range schema.NumLosses {
		if n, ok := r.Losses[l.String()]; !ok || n != 0 {
			t.Errorf("loss %s: %d (reported: %t)", l, n, ok)
		}
	}
	if len(r.Losses) != int(schema.NumLosses) {
		t.Errorf("losses %v", r.Losses)
	}
}

// TestTopPlainLines: top without a terminal prints plain lines. Memory
// allocated once and held (simwork hold) is not growing: its GROWING is
// "-". A leak beside it (simwork.py leak, a step every 50 ms: leak_step
// keeps 1 MiB a step) is, by the agent's rule at top's
// --growth-interval: its row's GROWING is what it grew, and the line below
// the table names it.
func TestTopPlainLines(t *testing.T) {
	w := startWorkload(t, nil, simwork, "hold", "5000000")
	leak := startWorkload(t, []string{"SIMCUDA_LIB=" + simLib}, pythons(t)[2], filepath.Join(repoRoot, "tests/workloads/simwork.py"), "leak")
	c := startCLI(t, "top", "--pid", strconv.Itoa(w.pid), "--pid", strconv.Itoa(leak.pid), "--interval", "200ms",
		"--growth-interval", "300ms", "--growth-intervals", "2")
	c.waitEvent(logs.Attached, "kind", "driver")
	c.waitStdout("PID +COMM") // a refresh before the allocation
	w.run()
	leak.stdinLine("")
	if line := leak.line(); line != "step" {
		t.Fatalf("workload said %q, want step", line)
	}
	go stepEvery(leak, 50*time.Millisecond)
	c.waitStdout(`^growing: pid ` + strconv.Itoa(leak.pid) + ` \(python3[.0-9]*\): .* under leak_step <- leak <- main for `)
	c.interrupt()
	out := c.stdout.String()
	if strings.Contains(out, "\033[") {
		t.Errorf("escape codes in non-terminal output")
	}
	// The workload made its context before gpumem started: its device is
	// unknown.
	for _, want := range []string{
		"PID +COMM +POD +KIND +GPU +LIVE +GROWING +ALLOCATED +ALLOCS +FREES +FAILURES +HOTTEST FRAME$",
		strconv.Itoa(w.pid) + ` +simwork +- +device +unknown +4.8 MiB +- +4.8 MiB +1 +0 +0 +hold$`,
		strconv.Itoa(leak.pid) + ` +python3[.0-9]* +- +device +0 +[0-9.]+ MiB +\+[0-9.]+ MiB .* leak_step$`,
	} {
		if !matchLine(out, want) {
			t.Errorf("no line matching %q in:\n%s", want, out)
		}
	}
	w.exit()
}

// TestClearErrors: what the user must fix is one line and exit code 2.
func TestClearErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
		want string
	}{
		{"not root", []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", gpumem, "record"}, "needs root"},
		{"user namespace", []string{"unshare", "--user", "--map-root-user", gpumem, "record"}, "needs root"},
		{"no such pid", []string{gpumem, "record", "--pid", "999999999"}, "no process with pid 999999999"},
		{"bad format", []string{gpumem, "record", "--format", "xml"}, `unknown --format "xml"`},
		{"bad value", []string{gpumem, "record", "--value", "max"}, `unknown value "max": want inuse, alloc or peak`},
		{"bad view", []string{gpumem, "record", "--format", "folded", "--view", "both"}, `--view: unknown view "both": want driver or tensor`},
		{"bad flag", []string{gpumem, "record", "--bogus"}, "unknown flag: --bogus"},
		{"bad pyroscope url", []string{gpumem, "agent", "--pyroscope-url", "pyroscope:4040"}, `bad pyroscope URL "pyroscope:4040"`},
		{"missing password file", []string{gpumem, "agent", "--pyroscope-url", "http://localhost:4040", "--pyroscope-password-file", "/nonexistent"}, "read credential"},
		// -o is checked before recording, not after: a recording is not
		// lost for want of a place to write it.
		{"output folder missing", []string{gpumem, "record", "-o", "missing/gpu.pb.gz"}, "-o missing/gpu.pb.gz: folder missing does not exist"},
		{"output folder read-only", append(chartCaps(), gpumem, "record", "-o", "read-only/gpu.pb.gz"),
			"-o read-only/gpu.pb.gz: cannot write in folder read-only: permission denied"},
		{"output a folder", []string{gpumem, "record", "--format", "json", "-o", "read-only"}, "-o read-only: a folder, not a file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
			cmd.Dir = t.TempDir()
			if err := os.Mkdir(filepath.Join(cmd.Dir, "read-only"), 0o555); err != nil {
				t.Fatal(err)
			}
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("exit %v, want code 2; output:\n%s", err, out)
			}
			first, _, _ := strings.Cut(string(out), "\n")
			if !strings.HasPrefix(first, "gpumem: ") || !strings.Contains(first, tc.want) {
				t.Errorf("first line %q, want gpumem: ...%s...", first, tc.want)
			}
		})
	}
}

// chartCaps is setpriv as the chart's DaemonSet runs gpumem: root with the
// chart's capabilities only (without CAP_DAC_OVERRIDE, a folder's mode
// holds for root too).
func chartCaps() []string {
	return []string{"setpriv", "--bounding-set", "-all,+bpf,+perfmon,+sys_ptrace,+checkpoint_restore", "--inh-caps", "-all", "--no-new-privs"}
}

// TestRecordKeepsTheReport: when -o cannot be written at the end (its
// folder removed during the recording, or its file system full: /dev/full,
// and a full tmpfs, where no part of the report is left), the report is
// kept in the temporary folder, under a name that says whose and when, and
// gpumem says where, exiting 1.
func TestRecordKeepsTheReport(t *testing.T) {
	for _, tc := range []struct{ name, output, want string }{
		{"folder removed", "out/gpu.json", "create %s: no such file or directory; the report is kept in "},
		{"file system full", "/dev/full", "write %s: no space left on device; the report is kept in "},
		{"tmpfs full", "full/gpu.json", "write %s: no space left on device; the report is kept in "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, kept := t.TempDir(), t.TempDir()
			t.Setenv("TMPDIR", kept)
			output := tc.output
			var filler string
			switch {
			case tc.name == "tmpfs full":
				output = filepath.Join(dir, output)
				filler = fullTmpfs(t, filepath.Dir(output)) // a new file is still taken: -o is checked at start
			case !filepath.IsAbs(output):
				output = filepath.Join(dir, output)
				if err := os.Mkdir(filepath.Dir(output), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			w := startWorkload(t, nil, simwork, "kinds")
			c := startCLI(t, "record", "--pid", strconv.Itoa(w.pid), "--format", "json", "-o", output)
			c.waitEvent(logs.Attached, "kind", "driver")
			w.run()
			if err := os.RemoveAll(filepath.Join(dir, "out")); err != nil {
				t.Fatal(err)
			}
			c.cmd.Process.Signal(os.Interrupt)
			var exit *exec.ExitError
			if err := c.cmd.Wait(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("gpumem: %v, want exit code 1", err)
			}
			w.exit()
			want := fmt.Sprintf(tc.want, output)
			line := c.stderr.wait(t, want)[0]
			_, path, _ := strings.Cut(line, want)
			if dir, name := filepath.Split(path); filepath.Clean(dir) != kept || !matchLine(name, fmt.Sprintf(`^gpumem-%d-\d{8}T\d{6}\.json$`, c.cmd.Process.Pid)) {
				t.Errorf("kept in %s, want %s/gpumem-PID-TIME.json", path, kept)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var r struct {
				Stacks []struct {
					LiveBytes uint64 `json:"live_bytes"`
				}
			}
			if err := json.Unmarshal(data, &r); err != nil {
				t.Fatalf("kept report: %v", err)
			}
			var live uint64
			for _, s := range r.Stacks {
				live += s.LiveBytes
			}
			if live != 8620032 {
				t.Errorf("kept report: %d bytes live, want 8620032", live)
			}
			if info, err := os.Stat("/dev/full"); err != nil || info.Mode()&os.ModeDevice == 0 {
				t.Errorf("/dev/full: %v %v", info, err)
			}
			if filler != "" {
				if entries, err := os.ReadDir(filepath.Dir(output)); err != nil || len(entries) != 1 || entries[0].Name() != filepath.Base(filler) {
					t.Errorf("the full file system holds %v (%v), want only %s", entries, err, filepath.Base(filler))
				}
			}
		})
	}
}

// TestSaysItIsWaiting: with no driver library mapped, gpumem says so.
func TestSaysItIsWaiting(t *testing.T) {
	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	c := startCLI(t, "record", "--pid", strconv.Itoa(sleep.Process.Pid), "-o", filepath.Join(t.TempDir(), "out.pb.gz"))
	c.waitStderr("waiting for a process to load libcuda.so")
	c.interrupt()
}

// TestLogFormats: the json log says, line for line, the sentences of the
// text log, each a JSON object, and its milestones as events with their
// values. Two recorders of one process, one of each format, log the same.
func TestLogFormats(t *testing.T) {
	w := startWorkload(t, nil, simwork, "kinds")
	args := []string{"record", "--pid", strconv.Itoa(w.pid), "--top", "0", "-o", "-"}
	jsonRecorder := startCLI(t, args...)
	textRecorder := startCommandLine(t, exec.Command(gpumem, args...))
	jsonRecorder.waitEvent(logs.Attached, "kind", "driver")
	jsonRecorder.waitEvent(logs.Recording)
	textRecorder.waitStderr("gpumem: attached to ")
	textRecorder.waitStderr("gpumem: recording")
	w.run()
	jsonRecorder.interrupt()
	textRecorder.interrupt()
	w.exit()
	for range jsonRecorder.lines { // to the last line
	}
	for range textRecorder.lines {
	}

	var fromJSON []string
	for _, line := range jsonRecorder.stderr.lines {
		fromJSON = append(fromJSON, "gpumem: "+line)
	}
	text := textRecorder.stderr.lines
	// Sorted: each process says when its own goroutines get there.
	if slices.Sort(fromJSON); !slices.Equal(fromJSON, slices.Sorted(slices.Values(text))) {
		t.Errorf("json log's sentences:\n%s\ntext log:\n%s", strings.Join(fromJSON, "\n"), strings.Join(text, "\n"))
	}
	var events []string
	for _, e := range jsonRecorder.stderr.events {
		fields, err := json.Marshal(e.Fields)
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, e.Event+" "+string(fields))
	}
	slices.Sort(events)
	want := []string{
		fmt.Sprintf(`attached {"kind":"driver","library":"/proc/%d/root%s","probes":32}`, w.pid, simLib),
		"recording {}",
	}
	if !slices.Equal(events, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(events, "\n"), strings.Join(want, "\n"))
	}
}

// readProfile parses a pprof file with pprof's own package.
func readProfile(t *testing.T, path string) *profile.Profile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func matchLine(text, pattern string) bool {
	re := regexpMustCompile("(?m)" + pattern)
	return re.MatchString(text)
}

var regexpMustCompile = regexp.MustCompile

// TestShortLivedProcesses: commands that allocate and exit within a second
// are named in full, native frames and Python frames, though they are gone
// before the report. (Their names are read from the living process: one
// whose events the reader reaches only after it exited, on a machine busy
// enough to delay the reader that long, keeps its addresses unnamed.)
func TestShortLivedProcesses(t *testing.T) {
	for name, command := range map[string][]string{
		"C":      {"env", "SIMWORK_NOWAIT=1", "SIMWORK_LINGER_MS=1000", simwork, "kinds"},
		"Python": {"env", "SIMWORK_LINGER_MS=1000", "SIMCUDA_LIB=" + simLib, "/root/.pyenv/versions/3.12.1/bin/python3.12", filepath.Join(repoRoot, "tests/workloads/simwork.py"), "sites"},
	} {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out.folded")
			cmd := exec.Command(gpumem, append([]string{"record", "--library", simLib, "--format", "folded", "--value", "alloc", "-o", out, "--"}, command...)...)
			if output, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%v\n%s", err, output)
			}
			data, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			want := `;main;kinds;alloc_device;cuMemAlloc_v2 3145728$`
			if name == "Python" {
				want = `;<module>;main;sites;Model.method;cuda_malloc;.*cuMemAlloc_v2 1002$`
			}
			if !matchLine(string(data), want) {
				t.Errorf("no line matching %q:\n%s", want, data)
			}
		})
	}
}
