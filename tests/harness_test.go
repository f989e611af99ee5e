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
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/profiler"
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
	line := w.line()
	fields, ok := strings.CutPrefix(line+" ", "expect ")
	if !ok {
		w.t.Fatalf("workload said %q, want expect ...", line)
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

// session is a profiler running in the test process.
type session struct {
	t      *testing.T
	cfg    profiler.Config
	p      *profiler.Profiler
	cancel context.CancelFunc
	done   chan error
	logs   chan string
}

func startProfiler(t *testing.T, cfg profiler.Config) *session {
	t.Helper()
	logs := make(chan string, 100)
	cfg.Logf = func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		t.Log(msg)
		select {
		case logs <- msg:
		default:
		}
	}
	p, err := profiler.New(cfg)
	if err != nil {
		t.Fatalf("profiler: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{t: t, cfg: cfg, p: p, cancel: cancel, done: make(chan error, 1), logs: logs}
	go func() { s.done <- p.Run(ctx) }()
	t.Cleanup(func() { s.stop() })
	return s
}

// report returns the books once every event sent so far is accounted.
func (s *session) report() profiler.Report {
	s.t.Helper()
	if err := s.p.Sync(); err != nil {
		s.t.Fatal(err)
	}
	r, err := s.p.Report()
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
func (s *session) waitLog(want string, timeout time.Duration) string {
	s.t.Helper()
	return s.waitLogs(timeout, want)[0]
}

// waitLogs waits for log messages containing each of wants, in any order.
func (s *session) waitLogs(timeout time.Duration, wants ...string) []string {
	s.t.Helper()
	found := make([]string, len(wants))
	missing := len(wants)
	deadline := time.After(timeout)
	for missing > 0 {
		select {
		case msg := <-s.logs:
			for i, want := range wants {
				if found[i] == "" && strings.Contains(msg, want) {
					found[i] = msg
					missing--
					break
				}
			}
		case <-deadline:
			s.t.Fatalf("no log %q within %v (found %q)", wants, timeout, found)
		}
	}
	return found
}
