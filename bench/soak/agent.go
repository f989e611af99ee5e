package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/metrics"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/schema"
)

// agent is `gpumem agent` as a node runs it, traced by the soak through
// /proc, its metrics and its status lines.
type agent struct {
	cmd        *exec.Cmd
	pid        int
	metricsURL string
	log        *os.File

	mu     sync.Mutex
	status string // the last status line
}

// startAgent starts the agent on driver, pushing to url, and waits until
// it is attached and serving its metrics.
func startAgent(bin, driver, url string, interval time.Duration, logPath string) (*agent, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "agent", "--library", driver, "--pyroscope-url", url,
		"--pyroscope-interval", interval.String(), "--status-interval", interval.String(), "--metrics-address", "127.0.0.1:0", "--node-name", "soak")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGINT} // the soak gone, the agent stops
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	a := &agent{cmd: cmd, pid: cmd.Process.Pid, log: log}
	ready := make(chan string, 2)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(log, time.Now().UTC().Format("15:04:05.000"), line)
			switch {
			case strings.Contains(line, "serving metrics at "):
				say(ready, line[strings.Index(line, "http://"):])
			case strings.Contains(line, "attached to "+driver):
				say(ready, "")
			case strings.Contains(line, "status: "):
				a.mu.Lock()
				a.status = line[strings.Index(line, "status: "):]
				a.mu.Unlock()
			}
		}
	}()
	deadline := time.After(time.Minute)
	for got := 0; got < 2; got++ {
		select {
		case v := <-ready:
			if v != "" {
				a.metricsURL = v
			}
		case <-deadline:
			cmd.Process.Kill()
			return nil, fmt.Errorf("agent: not attached and serving metrics within a minute (log: %s)", logPath)
		}
	}
	return a, nil
}

// say sends v unless ch is full: the agent's stderr is read on whatever
// happens.
func say(ch chan string, v string) {
	select {
	case ch <- v:
	default:
	}
}

// lastStatus is the newest status line.
func (a *agent) lastStatus() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status
}

func (a *agent) stop() {
	a.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() {
		a.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		a.cmd.Process.Kill()
		<-done
	}
	a.log.Close()
}

// footprint is what the agent holds, read from /proc and its metrics.
type footprint struct {
	rssMiB     float64
	goroutines float64
	heapMiB    float64 // the live heap at the last collection
	fds        float64
	cpuSeconds float64
	pids       int // processes in its metrics
}

func (a *agent) footprint() (footprint, error) {
	var f footprint
	var err error
	if f.rssMiB, err = rssMiB(a.pid); err != nil {
		return f, err
	}
	families, err := metricstest.Get(a.metricsURL)
	if err != nil {
		return f, err
	}
	f.goroutines = gauge(families, "go_goroutines")
	f.heapMiB = gauge(families, "go_gc_heap_live_bytes") / (1 << 20)
	f.fds = gauge(families, "process_open_fds")
	if m := families["process_cpu_seconds_total"].GetMetric(); len(m) == 1 {
		f.cpuSeconds = m[0].GetCounter().GetValue()
	}
	f.pids = len(pidsIn(families))
	return f, nil
}

func gauge(families map[string]*dto.MetricFamily, name string) float64 {
	if m := families[name].GetMetric(); len(m) == 1 {
		return m[0].GetGauge().GetValue()
	}
	return -1
}

// pidsIn are the processes the agent's metrics hold.
func pidsIn(families map[string]*dto.MetricFamily) map[string]bool {
	pids := map[string]bool{}
	for _, m := range families[metrics.ViewNames(0).Allocations].GetMetric() {
		pids[metricstest.Labels(m)[schema.PID]] = true
	}
	return pids
}

// rssMiB is a process's resident set, VmRSS.
func rssMiB(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.Atoi(strings.Fields(v)[0])
			return float64(kib) / 1024, err
		}
	}
	return 0, fmt.Errorf("pid %d: no VmRSS", pid)
}

// finalState is the agent's state once the churn is over and it settled.
type finalState struct {
	err       error
	status    string // its last status line
	pids      int    // processes in its metrics
	queued    float64
	pushed    float64
	failed    float64 // push attempts retried
	dropped   float64
	rejected  float64
	losses    map[string]float64
	unknown   float64
	bpfMaps   map[string]int // entries of its hash maps by name
	bpfErr    error
	footprint footprint
}

func (a *agent) final() finalState {
	f := finalState{status: a.lastStatus(), losses: map[string]float64{}}
	families, err := metricstest.Get(a.metricsURL)
	if err != nil {
		f.err = err
		return f
	}
	f.pids = len(pidsIn(families))
	f.queued = gauge(families, "gpumem_pyroscope_queued")
	counter := func(name string) float64 {
		var sum float64
		for _, m := range families[name].GetMetric() {
			sum += m.GetCounter().GetValue()
		}
		return sum
	}
	f.pushed = counter("gpumem_pyroscope_pushed_total")
	f.failed = counter("gpumem_pyroscope_push_failures_total")
	f.dropped = counter("gpumem_pyroscope_dropped_total")
	f.rejected = counter("gpumem_pyroscope_rejected_total")
	f.unknown = counter(metrics.UnknownFreesName)
	for _, m := range families[metrics.LossesName].GetMetric() {
		f.losses[metricstest.Labels(m)[metrics.LabelReason]] = m.GetCounter().GetValue()
	}
	f.footprint, f.err = a.footprint()
	f.bpfMaps, f.bpfErr = a.bpfMapEntries()
	return f
}

// bpfMapEntries counts the entries of the agent's hash maps, found from
// its file descriptors: what the kernel keeps per process and per call
// must be gone with the processes.
func (a *agent) bpfMapEntries() (map[string]int, error) {
	fdDir := fmt.Sprintf("/proc/%d/fd", a.pid)
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, err
	}
	entries := map[string]int{}
	seen := map[string]bool{}
	for _, fd := range fds {
		if target, _ := os.Readlink(filepath.Join(fdDir, fd.Name())); target != "anon_inode:bpf-map" {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", a.pid, fd.Name()))
		if err != nil {
			continue
		}
		var id, typ string
		for _, line := range strings.Split(string(info), "\n") {
			k, v, _ := strings.Cut(line, ":")
			switch k {
			case "map_id":
				id = strings.TrimSpace(v)
			case "map_type":
				typ = strings.TrimSpace(v)
			}
		}
		// Hash maps (1), LRU hash maps (9): keyed by process, thread or
		// call.
		if seen[id] || typ != "1" && typ != "9" {
			continue
		}
		seen[id] = true
		n, name, err := countEntries(id)
		if err != nil {
			return nil, err
		}
		entries[name] += n
	}
	return entries, nil
}

// countEntries dumps a map with bpftool.
func countEntries(id string) (int, string, error) {
	show, err := exec.Command("bpftool", "-j", "map", "show", "id", id).Output()
	if err != nil {
		return 0, "", fmt.Errorf("bpftool map show id %s: %w", id, err)
	}
	var m struct{ Name string }
	if err := json.Unmarshal(show, &m); err != nil {
		return 0, "", err
	}
	dump, err := exec.Command("bpftool", "-j", "map", "dump", "id", id).Output()
	if err != nil {
		return 0, "", fmt.Errorf("bpftool map dump id %s: %w", id, err)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(dump, &items); err != nil {
		return 0, "", err
	}
	return len(items), m.Name, nil
}
