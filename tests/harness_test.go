// End-to-end tests: the real BPF program, attached with real uprobes to the
// simulated CUDA driver (tests/simcuda), traced while real workload processes
// call it. They run as root.
package tests

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

var (
	repoRoot string
	simLib   string // the simulated libcuda.so.1
	simwork  string // the C workload
	gpumem   string // the CLI
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "tests: the end-to-end tests load BPF and must run as root")
		os.Exit(1)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		panic(err)
	}
	repoRoot = root
	build := exec.Command("make", "-s", "-C", root, "sim", "build")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "tests: make sim build: %v\n", err)
		os.Exit(1)
	}
	simLib = filepath.Join(root, "build/sim/libcuda.so.1")
	simwork = filepath.Join(root, "build/sim/simwork")
	gpumem = filepath.Join(root, "bin/gpumem")
	code := m.Run()
	removeImage()
	os.Exit(code)
}

// workload is a process speaking simwork's protocol: "ready PID", a line to
// start, "done" and one "expect k=v..." line, a line to exit.
type workload struct {
	t      *testing.T
	cmd    *exec.Cmd
	pid    int
	stdin  io.WriteCloser
	stdout *bufio.Scanner
}

func startWorkload(t *testing.T, env []string, name string, args ...string) *workload {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	w := &workload{t: t, cmd: cmd, stdin: stdin, stdout: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		w.cmd.Process.Kill()
		w.cmd.Wait()
	})
	line := w.line()
	pid, ok := strings.CutPrefix(line, "ready ")
	if !ok {
		t.Fatalf("%s said %q, want ready PID", name, line)
	}
	if w.pid, err = strconv.Atoi(pid); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *workload) line() string {
	w.t.Helper()
	if !w.stdout.Scan() {
		w.t.Fatalf("workload ended early: %v", w.stdout.Err())
	}
	return w.stdout.Text()
}

// run starts the scenario and returns its expect values once it is done.
func (w *workload) run() map[string]uint64 {
	w.t.Helper()
	fmt.Fprintln(w.stdin)
	if line := w.line(); line != "done" {
		w.t.Fatalf("workload said %q, want done", line)
	}
	return w.values("expect")
}

// values reads a line of the workload's, "what k=v ...", and returns its
// values.
func (w *workload) values(what string) map[string]uint64 {
	w.t.Helper()
	line := w.line()
	fields, ok := strings.CutPrefix(line+" ", what+" ")
	if !ok {
		w.t.Fatalf("workload said %q, want %s ...", line, what)
	}
	expect := map[string]uint64{}
	for _, kv := range strings.Fields(fields) {
		k, v, _ := strings.Cut(kv, "=")
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			w.t.Fatalf("bad expect %q", kv)
		}
		expect[k] = n
	}
	return expect
}

// exit lets the workload exit and waits for it.
func (w *workload) exit() {
	w.t.Helper()
	w.stdin.Close()
	if err := w.cmd.Wait(); err != nil {
		w.t.Fatalf("workload: %v", err)
	}
}

// hangLimit bounds every wait of the end-to-end tests. It is no measure of
// speed (benchmarks are): only a bound on a hang, generous enough for a
// machine busy with other tests beside these.
const hangLimit = 2 * time.Minute

// logBook keeps every line a profiler or command logged, so that a wait finds
// a line whether it was logged before the wait began or after, and the
// writer never blocks on a reader.
type logBook struct {
	mu      sync.Mutex
	lines   []string      // every line's sentence, a summary's line by line as the text log says them
	events  []logs.Line   // the lines of an event
	changed chan struct{} // closed at each new line, then replaced
	ended   bool
}

func newLogBook() *logBook { return &logBook{changed: make(chan struct{})} }

func (b *logBook) add(line logs.Line) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, strings.Split(line.Msg, "\n")...)
	if line.Event != "" {
		b.events = append(b.events, line)
	}
	close(b.changed)
	b.changed = make(chan struct{})
}

// end says no line will come any more (the command exited).
func (b *logBook) end() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ended = true
	close(b.changed)
	b.changed = make(chan struct{})
}

// wait returns, for each of wants, the first sentence containing it,
// waiting for those still missing: for the tests of the words a user
// reads.
func (b *logBook) wait(t *testing.T, wants ...string) []string {
	t.Helper()
	return awaitEach(t, b, fmt.Sprintf("line %q", wants), len(wants), func() []string { return b.lines },
		func(i int, line string) bool { return strings.Contains(line, wants[i]) })
}

// waitEvent returns the fields of the first event name whose fields hold
// each of wants (key-value pairs, values compared as printed), waiting for
// it: for the tests that wait for a milestone.
func (b *logBook) waitEvent(t *testing.T, name string, wants ...any) map[string]any {
	t.Helper()
	return awaitEach(t, b, fmt.Sprintf("event %s %v", name, wants), 1, func() []logs.Line { return b.events },
		func(_ int, l logs.Line) bool { return l.Is(name, wants...) })[0].Fields
}

// awaitEach returns, for each of n wants, the first of b's entries that
// matches it, waiting for those still missing.
func awaitEach[E any](t *testing.T, b *logBook, what string, n int, entries func() []E, matches func(want int, e E) bool) []E {
	t.Helper()
	deadline := time.After(hangLimit)
	found := make([]E, n)
	done := make([]bool, n)
	for {
		b.mu.Lock()
		missing := 0
		for i := range n {
			for _, e := range entries() {
				if !done[i] && matches(i, e) {
					found[i], done[i] = e, true
				}
			}
			if !done[i] {
				missing++
			}
		}
		changed, ended := b.changed, b.ended
		b.mu.Unlock()
		if missing == 0 {
			return found
		}
		if ended {
			t.Fatalf("no %s before the end", what)
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no %s within %v", what, hangLimit)
		}
	}
}

// session is a profiler running in the test process.
type session struct {
	t      *testing.T
	cfg    profiler.Config
	p      *profiler.Profiler
	cancel context.CancelFunc
	done   chan error
	logs   *logBook
}

// startProfiler runs a profiler of the workloads given, and of them only
// (cfg.PIDs): processes of other tests, of other packages run beside these,
// or of another run of the suite leave its books alone. Without workloads it
// traces what cfg says, for the tests of discovery.
func startProfiler(t *testing.T, cfg profiler.Config, ws ...*workload) *session {
	t.Helper()
	for _, w := range ws {
		cfg.PIDs = append(cfg.PIDs, w.pid)
	}
	book := newLogBook()
	cfg.Log = logs.To(func(l logs.Line) {
		t.Log(l.Msg)
		book.add(l)
	})
	p, err := profiler.New(cfg)
	if err != nil {
		t.Fatalf("profiler: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{t: t, cfg: cfg, p: p, cancel: cancel, done: make(chan error, 1), logs: book}
	go func() { s.done <- p.Run(ctx) }()
	t.Cleanup(func() { s.stop(); p.Close() })
	return s
}

// report returns the books once every event sent so far is accounted.
func (s *session) report() *snapshot.Snapshot {
	s.t.Helper()
	if err := s.p.Sync(); err != nil {
		s.t.Fatal(err)
	}
	r, err := s.p.Snapshot()
	if err != nil {
		s.t.Fatal(err)
	}
	return r
}

func (s *session) stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	if err := <-s.done; err != nil {
		s.t.Errorf("profiler: %v", err)
	}
}

// waitLog waits for a log message containing want.
func (s *session) waitLog(want string) string {
	s.t.Helper()
	return s.logs.wait(s.t, want)[0]
}

// waitEvent waits for the event name whose fields hold wants (key-value
// pairs), and returns its fields.
func (s *session) waitEvent(name string, wants ...any) map[string]any {
	s.t.Helper()
	return s.logs.waitEvent(s.t, name, wants...)
}

// stdinLine writes a line to the workload, which a scenario waits for.
func (w *workload) stdinLine(line string) {
	w.t.Helper()
	if _, err := fmt.Fprintln(w.stdin, line); err != nil {
		w.t.Fatal(err)
	}
}
