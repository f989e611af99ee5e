package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// workload is one kind of process the soak starts, each in turn.
type workload struct {
	name string
	// stacks is how many distinct stacks one process allocates from, by
	// its design, none shared with another process of the soak (0: a
	// few, the same in every process of the kind).
	stacks func() int
	// command is the process; first is where its range of stacks begins.
	command func(s *soak, first int, python string) *exec.Cmd
	// unloads is how many times one process unloads the driver.
	unloads int
}

// cycles is how many times a dlopen process loads and unloads the driver.
const cycles = 5

var workloads = []workload{
	{name: "native stacks", stacks: func() int { return *stacksPer }, command: func(s *soak, first int, _ string) *exec.Cmd {
		// Call paths first to first+N: no two processes share one.
		return exec.Command(s.simwork(), "stacks", strconv.Itoa(*stacksPer), strconv.Itoa(first))
	}},
	{name: "native threads", command: func(s *soak, _ int, _ string) *exec.Cmd {
		// Two threads allocating and freeing for a second, 1000 a second each.
		return exec.Command(s.simwork(), "threads", "2", "1", "1000")
	}},
	{name: "Python stacks", stacks: func() int { return 2 * *stacksPer }, command: func(s *soak, first int, python string) *exec.Cmd {
		// Functions generated with names no other process has, each
		// allocating from two lines.
		cmd := exec.Command(python, s.simworkPy(), "stacks")
		cmd.Env = []string{"SIMWORK_STACKS=" + strconv.Itoa(*stacksPer), "SIMWORK_FIRST=" + strconv.Itoa(first)}
		return cmd
	}},
	{name: "Python dlopen", unloads: cycles, command: func(s *soak, _ int, python string) *exec.Cmd {
		cmd := exec.Command(python, s.simworkPy(), "dlopen")
		cmd.Env = []string{"SIMWORK_CYCLES=" + strconv.Itoa(cycles)}
		return cmd
	}},
	{name: "Python model", command: func(s *soak, _ int, python string) *exec.Cmd {
		// Nested functions, four threads, frees.
		return exec.Command(python, s.simworkPy(), "model")
	}},
}

// pythons are the interpreters the Python workloads take in turn: those
// of the machine image that are here.
var pythons = func() []string {
	var found []string
	for _, p := range []string{
		"/root/.pyenv/versions/3.10.13/bin/python3.10", "/root/.pyenv/versions/3.11.7/bin/python3.11",
		"/root/.pyenv/versions/3.12.1/bin/python3.12", "/root/.pyenv/versions/3.13.0/bin/python3.13", "/usr/bin/python3",
	} {
		if _, err := os.Stat(p); err == nil {
			found = append(found, p)
		}
	}
	return found
}()

func (s *soak) simwork() string   { return filepath.Join(s.root, "build/sim/simwork") }
func (s *soak) simworkPy() string { return filepath.Join(s.root, "tests/workloads/simwork.py") }

// process is one process the soak started, and what its books were.
type process struct {
	kind     string
	python   string
	pid      int
	stacks   int // distinct stacks by design
	unloads  int
	started  time.Time
	want     counts // the workload's own
	seen     counts // the agent's, in its metrics, before the process exited
	exact    bool
	err      error
	lifetime time.Duration
}

// startProcess starts the n-th process, and checks it in the background.
func (s *soak) startProcess(n int) {
	w := workloads[n%len(workloads)]
	python := ""
	if len(pythons) > 0 {
		python = pythons[(n/len(workloads))%len(pythons)]
	}
	p := &process{kind: w.name, unloads: w.unloads}
	first := 0
	if w.stacks != nil {
		p.stacks = w.stacks()
		s.mu.Lock()
		first = s.first[w.name]
		s.first[w.name] += *stacksPer
		s.mu.Unlock()
	}
	cmd := w.command(s, first, python)
	if strings.HasPrefix(w.name, "Python") {
		p.python = filepath.Base(python)
	}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	s.running.Add(1)
	go func() {
		defer s.running.Done()
		start := time.Now()
		p.err = s.runProcess(p, cmd)
		p.lifetime = time.Since(start)
		if p.err != nil {
			fmt.Fprintf(os.Stderr, "soak: %s (pid %d): %v\n", p.kind, p.pid, p.err)
		}
	}()
}

// pythonStart is how long a Python process waits before it allocates.
const pythonStart = time.Second

// processLimit is how long a process may take, its check included.
const processLimit = 2 * time.Minute

// runProcess runs a process through the workloads' protocol: "ready PID",
// a line to start, "expect" with its totals; then its books are checked
// in the agent's metrics while it lives, and a line lets it exit.
func (s *soak) runProcess(p *process, cmd *exec.Cmd) error {
	cmd.Env = append(append(os.Environ(), "LD_LIBRARY_PATH="+s.dir, "SIMCUDA_LIB="+s.driver), cmd.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	p.pid = cmd.Process.Pid
	kill := time.AfterFunc(processLimit, func() { cmd.Process.Kill() })
	defer kill.Stop()
	err = s.drive(p, stdin, bufio.NewScanner(stdout))
	stdin.Close()
	io.Copy(io.Discard, stdout)
	if werr := cmd.Wait(); err == nil && werr != nil {
		err = fmt.Errorf("%w: %s", werr, strings.TrimSpace(stderr.String()))
	}
	return err
}

func (s *soak) drive(p *process, stdin io.Writer, out *bufio.Scanner) error {
	if !out.Scan() || !strings.HasPrefix(out.Text(), "ready ") {
		return fmt.Errorf("no ready line")
	}
	if p.python != "" {
		// As a real one spends its first seconds importing before its
		// first allocation: Python frames are read once the agent has
		// found the interpreter, at its next scan (500 ms).
		time.Sleep(pythonStart)
	}
	if _, err := io.WriteString(stdin, "\n"); err != nil {
		return err
	}
	for out.Scan() {
		if line, ok := strings.CutPrefix(out.Text(), "expect "); ok {
			var err error
			if p.want, err = countsFrom(line); err != nil {
				return err
			}
			p.seen, p.exact = s.books.expect(p.pid, p.want, bookLimit)
			_, err = io.WriteString(stdin, "\n") // exit now
			return err
		}
	}
	return fmt.Errorf("no expect line")
}
