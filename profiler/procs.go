package profiler

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/pystack"
)

// The process table: what the profiler knows of each process besides its
// books. Its name comes with its events; its GPUs (CUDA's ordinals, from
// its environment), its pod and container (its cgroup), its memory maps
// (for the symbolizer) and whether it is a Python process to walk are
// read from /proc and its files. The goroutine that reads events never
// reads them: it notes a process it has not seen, or a Python process not
// registered yet, and enrich reads them at once, on a goroutine of its
// own, while the process lives.

// noteProcess notes the process of an event. The caller holds p.mu.
func (p *Profiler) noteProcess(pid uint32, comm string) {
	if _, seen := p.comms[pid]; !seen {
		p.toEnrich = append(p.toEnrich, pid)
		signal(p.enrichNow)
	}
	p.comms[pid] = comm
}

// askPython has process pid registered as a Python process if it is one:
// its allocations carry Python frames once it is. The caller holds p.mu.
func (p *Profiler) askPython(pid uint32) {
	if p.notPython[int(pid)] || p.pyAsked[pid] {
		return
	}
	p.pyAsked[pid] = true
	signal(p.enrichNow)
}

// enrichNoted reads the processes noted since it last ran. One runs at a
// time: a report that calls it waits for the processes being read.
func (p *Profiler) enrichNoted() {
	p.enriching.Lock()
	defer p.enriching.Unlock()
	p.mu.Lock()
	pids := p.toEnrich
	p.toEnrich = nil
	var python []uint32
	for pid := range p.pyAsked {
		python = append(python, pid)
	}
	clear(p.pyAsked) // one that is not ready yet is asked again by its next event
	p.mu.Unlock()
	for _, pid := range pids {
		p.readProcess(pid)
	}
	for _, pid := range python {
		p.addPython(int(pid))
	}
}

// readProcess reads a new process's GPUs, pod and memory maps.
func (p *Profiler) readProcess(pid uint32) {
	ordinals := gpuinfo.Ordinals(p.devices, p.environ(pid))
	c := container.OfProcess(p.cfg.ProcRoot, int(pid))
	p.sym.Track(pid)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, known := p.comms[pid]; !known {
		p.sym.Forget(pid) // dropped while it was read
		return
	}
	p.ordinals[pid] = ordinals
	p.containers[pid] = c
}

// environ is a process's environment, which says which GPUs it sees; none
// when it cannot be read.
func (p *Profiler) environ(pid uint32) []string {
	if len(p.devices) == 0 {
		return nil
	}
	data, err := os.ReadFile(filepath.Join(p.cfg.ProcRoot, strconv.Itoa(int(pid)), "environ"))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
}

// container is where process pid runs, named when the API server is known.
// The caller holds p.mu.
func (p *Profiler) container(pid uint32) container.Identity {
	c := p.containers[pid]
	if p.cfg.Pods != nil {
		c = p.cfg.Pods.Name(c)
	}
	return c
}

// addPython registers a Python process with the BPF program and the
// resolver; false when pid is not one (yet). It reads the process's files:
// the caller does not hold p.mu.
func (p *Profiler) addPython(pid int) bool {
	p.registering.Lock()
	defer p.registering.Unlock()
	p.mu.Lock()
	done, notPython, watching := p.py.Has(uint32(pid)), p.notPython[pid], p.watching[pid]
	p.mu.Unlock()
	if done || notPython {
		return done
	}
	proc, err := pystack.Detect(p.cfg.ProcRoot, pid)
	switch {
	case errors.Is(err, pystack.ErrNotReady):
		return false
	case errors.Is(err, fs.ErrNotExist) && gone(p.cfg.ProcRoot, pid):
		return false // gone before it was read: nothing to walk
	case errors.Is(err, pystack.ErrNotPython) && watching:
		return false // not yet: a command between fork and exec
	case errors.Is(err, pystack.ErrNotPython):
		p.markNotPython(pid)
		return false
	case err != nil:
		p.markNotPython(pid)
		p.cfg.Logf("no Python frames for %v", err)
		return false
	}
	if err := p.tr.AddPython(uint32(pid), proc.Walk()); err != nil {
		p.cfg.Logf("%v", err)
		return false
	}
	if err := p.py.Add(proc); err != nil {
		p.tr.RemovePython(uint32(pid))
		p.cfg.Logf("pid %d: %v", pid, err)
		return false
	}
	p.mu.Lock()
	p.pyStats.Processes++
	p.mu.Unlock()
	p.cfg.Logf("pid %d: Python %s frames", pid, proc.Version)
	return true
}

// gone says whether process pid is known not to exist.
func gone(procRoot string, pid int) bool {
	_, err := os.Stat(filepath.Join(procRoot, strconv.Itoa(pid)))
	return errors.Is(err, fs.ErrNotExist)
}

func (p *Profiler) markNotPython(pid int) {
	p.mu.Lock()
	p.notPython[pid] = true
	p.mu.Unlock()
}

// Watch registers a process just started (gpumem record -- COMMAND) as soon
// as its interpreter is up, if it is a Python process, rather than at the
// next scan: a short script may allocate within the first half second.
// Until then, a process that is not (yet) Python is not written off.
func (p *Profiler) Watch(ctx context.Context, pid int) {
	ticker := time.NewTicker(10 * time.Millisecond)
	defer ticker.Stop()
	deadline := time.After(5 * time.Second)
	p.mu.Lock()
	p.watching[pid] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.watching, pid)
		p.mu.Unlock()
	}()
	for {
		p.mu.Lock()
		notPython := p.notPython[pid]
		p.mu.Unlock()
		if notPython || p.addPython(pid) {
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
