package profiler

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/pystack"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// processTable is what the profiler knows of each process besides its
// books. Its name comes with its events; its GPUs (CUDA's ordinals, from
// its environment), its pod and container (its cgroup), its memory maps
// (for the symbolizer) and whether it is a Python process to walk are
// read from /proc and its files. The goroutine that reads events never
// reads them: it notes a process it has not seen, or a Python process not
// registered yet, and readNoted reads them at once, on a goroutine of its
// own, while the process lives.
type processTable struct {
	procRoot string
	devices  []gpuinfo.Device // the driver's GPUs
	pods     container.Namer
	log      *slog.Logger
	sym      *symbolize.Symbolizer
	tr       Source
	py       *pystack.Resolver

	mu sync.Mutex
	// pids are what the table knows of each process, for as long as it
	// knows anything of it.
	pids        map[uint32]*tracked
	toRead      []uint32 // noted, not read yet
	pyAsked     []uint32 // to register as Python processes
	pyProcesses uint64   // Python processes registered
	// reading is the table's job, readNoted: the one goroutine that reads
	// processes and registers Python ones.
	reading *job
}

// tracked is what the table knows of one process; it is forgotten once
// all of it is zero (tidy).
type tracked struct {
	// proc is never changed once made: a process's next is a new one, so
	// that snapshots share them. Nil until noted, and once dropped.
	proc    *process
	renewed bool // in toRead: the PID was taken again by a new process
	python  bool // a registered Python process
	pyAsked bool // in pyAsked
	// notPython: it maps Python files but is not a Python process gpu-mem
	// can walk; not retried while it lives.
	notPython bool
	// notReady: its interpreter was starting; when to look again, not at
	// every event meanwhile, and how many looks found it so.
	notReady      time.Time
	notReadyLooks int
	watching      bool // a command Watch waits for
}

// process is what the table knows of one process: what snapshots share
// (its container as its cgroup says, not named), and whether it exited.
type process struct {
	snapshot.Process
	exited bool // an event after it is a new process's
	// allocated: an allocation of it was seen. A process whose first event
	// was a context made is read again at its first allocation: it may
	// have been moved into its pod's cgroup between the two.
	allocated bool
}

func newProcessTable(cfg Config, sym *symbolize.Symbolizer, tr Source, py *pystack.Resolver, stopped <-chan struct{}) *processTable {
	t := &processTable{
		procRoot: cfg.ProcRoot,
		devices:  gpuinfo.Devices(cfg.GPUDir),
		pods:     cfg.Pods,
		log:      cfg.Log,
		sym:      sym,
		tr:       tr,
		py:       py,
		pids:     map[uint32]*tracked{},
	}
	t.reading = newJob(t.readNoted, stopped)
	return t
}

// An event's part in noting its process.
type noted int

const (
	notedRelease    noted = iota // a free, a retain, a context destroyed
	notedContext                 // a context made: stacks, as an allocation has
	notedAllocation              // an allocation
)

// note notes the process of an event and says whether it is a registered
// Python process. An empty comm (a tensor event's record has none) leaves
// the comm known, and names a new process from /proc: its first event is a
// tensor's when the agent started after its driver calls. For an event
// with stacks, a Python process not yet
// registered is asked to be: its next allocations carry Python frames. A
// process first noted by a context it made is read again at its first
// allocation: it may have moved into its pod's cgroup between the two.
func (t *processTable) note(pid uint32, comm string, what noted) (python bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	allocation := what == notedAllocation
	e := t.entry(pid)
	switch p := e.proc; {
	case p == nil || p.exited:
		e.renewed = p != nil
		if comm == "" {
			comm = readComm(t.procRoot, pid) // once a process, so that no output shows it unnamed
		}
		e.proc = &process{Process: snapshot.Process{Comm: comm, Since: time.Now()}, allocated: allocation}
		t.toRead = append(t.toRead, pid)
		t.reading.ask()
	case (comm != "" && p.Comm != comm) || (allocation && !p.allocated):
		next := *p
		if comm != "" {
			next.Comm = comm
		}
		if allocation && !p.allocated {
			next.allocated = true
			t.toRead = append(t.toRead, pid)
			t.reading.ask()
		}
		e.proc = &next
	}
	if what != notedRelease && !e.python && !e.notPython && !e.pyAsked && !time.Now().Before(e.notReady) {
		e.pyAsked = true
		t.pyAsked = append(t.pyAsked, pid)
		t.reading.ask()
	}
	return e.python
}

// seenSince has a noted process be seen since t, if earlier: its event
// replayed from a previous agent's journal, so that its counters keep the
// start they had (metrics: their created timestamps).
func (t *processTable) seenSince(pid uint32, since time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.proc(pid); p != nil && since.Before(p.Since) {
		next := *p
		next.Since = since
		t.entry(pid).proc = &next
	}
}

// entry is what the table knows of pid, made if it knew nothing. The
// caller holds t.mu.
func (t *processTable) entry(pid uint32) *tracked {
	e := t.pids[pid]
	if e == nil {
		e = &tracked{}
		t.pids[pid] = e
	}
	return e
}

// proc is pid's process as noted; nil if not. The caller holds t.mu.
func (t *processTable) proc(pid uint32) *process {
	if e := t.pids[pid]; e != nil {
		return e.proc
	}
	return nil
}

// tidy forgets pid once the table knows nothing of it. The caller holds
// t.mu.
func (t *processTable) tidy(pid uint32) {
	if e := t.pids[pid]; e != nil && *e == (tracked{}) {
		delete(t.pids, pid)
	}
}

// askPython has processes found mapping a Python runtime registered, unless
// they are already, are not Python processes, or are left to start
// (notReady); it says whether any is being registered, which a caller
// that needs it done waits for (reading).
func (t *processTable) askPython(pids []int) (registering bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	for _, pid := range pids {
		e := t.entry(uint32(pid))
		if e.python || e.notPython || now.Before(e.notReady) {
			continue
		}
		if !e.pyAsked {
			e.pyAsked = true
			t.pyAsked = append(t.pyAsked, uint32(pid))
		}
		registering = true
	}
	if len(t.pyAsked) > 0 {
		t.reading.ask()
	}
	return registering
}

// notReadyRetry is how long a Python process whose interpreter was
// starting is left before it is looked at again, twice as long after each
// look that finds it starting still, up to maxNotReadyRetry: an
// interpreter starts within milliseconds, but one that never looks ready
// (an embedded or unusual build) would otherwise have its binary's symbols
// read at every scan while it lives.
const (
	notReadyRetry    = 50 * time.Millisecond
	maxNotReadyRetry = 30 * time.Second
)

// exited notes that a process exited, and says whether it was a
// registered Python process: it is no longer walked once its stacks'
// Python frames are read (stackStore.pythonExited).
func (t *processTable) exited(pid uint32) (python bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.pids[pid]
	if e == nil {
		return false
	}
	if e.proc != nil {
		next := *e.proc
		next.exited = true
		e.proc = &next
	}
	python = e.python
	e.python, e.notPython, e.notReady, e.notReadyLooks = false, false, time.Time{}, 0
	t.tidy(pid)
	return python
}

// drop forgets a dropped process.
func (t *processTable) drop(pid uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.pids[pid]; e != nil {
		e.proc = nil
		t.tidy(pid)
	}
	t.sym.Forget(pid)
}

// readNoted reads the processes noted since it last ran, and registers
// the Python processes asked for: the job t.reading, which a report awaits.
func (t *processTable) readNoted() {
	t.mu.Lock()
	pids, python := t.toRead, t.pyAsked
	t.toRead, t.pyAsked = nil, nil
	renewed := map[uint32]bool{}
	for _, pid := range pids {
		if e := t.pids[pid]; e != nil && e.renewed {
			e.renewed, renewed[pid] = false, true
		}
	}
	for _, pid := range python { // one that is not ready yet is asked again by its next event
		if e := t.pids[pid]; e != nil {
			e.pyAsked = false
			t.tidy(pid)
		}
	}
	t.mu.Unlock()
	for _, pid := range pids {
		if renewed[pid] {
			t.sym.Forget(pid) // the exited process's maps
		}
		t.read(pid)
	}
	for _, pid := range python {
		t.addPython(int(pid))
	}
}

// read reads a new process's GPUs, pod and memory maps.
func (t *processTable) read(pid uint32) {
	ordinals := gpuinfo.Ordinals(t.devices, t.environ(pid))
	c := container.OfProcess(t.procRoot, int(pid))
	t.sym.Track(pid)
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.proc(pid)
	if p == nil {
		t.sym.Forget(pid) // dropped while it was read
		return
	}
	next := *p
	next.GPUs, next.Container = ordinals, c
	t.pids[pid].proc = &next
}

// environ is a process's environment, which says which GPUs it sees; none
// when it cannot be read.
func (t *processTable) environ(pid uint32) []string {
	if len(t.devices) == 0 {
		return nil
	}
	data, err := os.ReadFile(filepath.Join(t.procRoot, strconv.Itoa(int(pid)), "environ"))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
}

// lookup returns what the table knows of each of pids, its container named
// where the API server is known: pids' processes for one snapshot.
func (t *processTable) lookup(pids map[uint32]*process) {
	t.mu.Lock()
	for pid := range pids {
		pids[pid] = t.proc(pid)
	}
	t.mu.Unlock()
	for pid, p := range pids {
		switch {
		case p == nil:
			pids[pid] = &process{}
		case t.pods != nil:
			named := *p
			named.Container = t.pods.Name(p.Container)
			pids[pid] = &named
		}
	}
}

// known sets each of pids to its process, while it lives; unknown ones
// stay nil.
func (t *processTable) known(pids map[uint32]*process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for pid := range pids {
		if p := t.proc(pid); p != nil && !p.exited {
			pids[pid] = p
		}
	}
}

// containers returns the container of each live process the table knows.
func (t *processTable) containers() map[uint32]container.Identity {
	t.mu.Lock()
	defer t.mu.Unlock()
	cs := map[uint32]container.Identity{}
	for pid, e := range t.pids {
		if p := e.proc; p != nil && !p.exited && p.Container.PodUID != "" {
			cs[pid] = p.Container
		}
	}
	return cs
}

// pids adds the processes the table knows to set.
func (t *processTable) addPIDs(set map[uint32]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for pid, e := range t.pids {
		if e.proc != nil {
			set[pid] = true
		}
	}
}

// addPython registers a Python process with the BPF program and the
// resolver; false when pid is not one (yet). It reads the process's files;
// it runs in the job t.reading only.
func (t *processTable) addPython(pid int) bool {
	t.mu.Lock()
	var done, notPython, watching bool
	if e := t.pids[uint32(pid)]; e != nil {
		done, notPython, watching = e.python, e.notPython, e.watching
	}
	t.mu.Unlock()
	if done || notPython {
		return done
	}
	proc, err := pystack.Detect(t.procRoot, pid)
	switch {
	case errors.Is(err, pystack.ErrNotReady):
		t.mu.Lock()
		e := t.entry(uint32(pid))
		e.notReady = time.Now().Add(min(notReadyRetry<<min(e.notReadyLooks, 16), maxNotReadyRetry))
		e.notReadyLooks++
		t.mu.Unlock()
		return false
	case errors.Is(err, fs.ErrNotExist) && gone(t.procRoot, pid):
		return false // gone before it was read: nothing to walk
	case errors.Is(err, pystack.ErrNotPython) && watching:
		return false // not yet: a command between fork and exec
	case errors.Is(err, pystack.ErrNotPython):
		t.markNotPython(pid)
		return false
	case err != nil:
		t.markNotPython(pid)
		logs.Printf(t.log, "no Python frames for %v", err)
		return false
	}
	if err := t.tr.AddPython(uint32(pid), proc.Walk()); err != nil {
		logs.Printf(t.log, "%v", err)
		return false
	}
	if err := t.py.Add(proc); err != nil {
		t.tr.RemovePython(uint32(pid))
		logs.Printf(t.log, "pid %d: %v", pid, err)
		return false
	}
	t.mu.Lock()
	e := t.entry(uint32(pid))
	e.python, e.notReady = true, time.Time{}
	t.pyProcesses++
	t.mu.Unlock()
	logs.Event(t.log, logs.Python, fmt.Sprintf("pid %d: Python %s frames", pid, proc.Version), "pid", pid, "version", proc.Version)
	return true
}

// readComm is a process's name, from /proc; empty once it is gone.
func readComm(procRoot string, pid uint32) string {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(int(pid)), "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

// gone says whether process pid is known not to exist.
func gone(procRoot string, pid int) bool {
	_, err := os.Stat(filepath.Join(procRoot, strconv.Itoa(pid)))
	return errors.Is(err, fs.ErrNotExist)
}

func (t *processTable) markNotPython(pid int) {
	t.mu.Lock()
	t.entry(uint32(pid)).notPython = true
	t.mu.Unlock()
}

// notPythonPIDs are the processes written off as not Python: the scans
// check whether they are gone.
func (t *processTable) notPythonPIDs() []uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var pids []uint32
	for pid, e := range t.pids {
		if e.notPython {
			pids = append(pids, pid)
		}
	}
	return pids
}

// registeredPython is how many Python processes were registered.
func (t *processTable) registeredPython() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pyProcesses
}

// Watch registers a process just started (gpumem record -- COMMAND) as soon
// as its interpreter is up, if it is a Python process, rather than at the
// next scan: a short script may allocate within the first half second.
// Until then, a process that is not (yet) Python is not written off.
func (p *Profiler) Watch(ctx context.Context, pid int) {
	t := p.procs
	ticker := time.NewTicker(10 * time.Millisecond)
	defer ticker.Stop()
	deadline := time.After(5 * time.Second)
	t.mu.Lock()
	t.entry(uint32(pid)).watching = true
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		if e := t.pids[uint32(pid)]; e != nil {
			e.watching = false
			t.tidy(uint32(pid))
		}
		t.mu.Unlock()
	}()
	for {
		t.askPython([]int{pid})
		t.reading.await()
		t.mu.Lock()
		e := t.pids[uint32(pid)]
		done := e != nil && (e.notPython || e.python)
		t.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline:
			return
		case <-ticker.C:
		}
	}
}
