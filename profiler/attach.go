package profiler

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/gpu-mem/gpu-mem/discover"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// attacher attaches the tracer to the driver libraries and PyTorch
// allocators found, each once; a failure is said once and retried at each
// scan.
type attacher struct {
	tr      Source
	library string      // Config.Library: the only driver attached
	tensors TensorScope // allocators are attached here with TensorsAll only
	log     *slog.Logger

	mu       sync.Mutex
	attached map[string]discover.Library
	failed   map[string]error // libraries whose attach failed, said once
	links    []io.Closer      // the allocators' probes (the tracer owns the driver's)
	// oomReports are the allocators whose out-of-memory report is probed,
	// or was said not to be: in every mode, with or without tensors.
	oomReports map[string]bool
}

func newAttacher(cfg Config, tr Source) *attacher {
	return &attacher{tr: tr, library: cfg.Library, tensors: cfg.Tensors, log: cfg.Log,
		attached: map[string]discover.Library{}, failed: map[string]error{}, oomReports: map[string]bool{}}
}

// attachOOMReport probes an allocator's out-of-memory report, once; a
// failure is said once: then the out-of-memory errors of PyTorch's own
// limits are not seen, the driver's refusals still are.
func (a *attacher) attachOOMReport(lib discover.Library) {
	a.mu.Lock()
	done := a.oomReports[lib.ID()]
	a.oomReports[lib.ID()] = true
	a.mu.Unlock()
	if done {
		return
	}
	l, err := a.tr.AttachOOMReport(lib.Path)
	if err != nil {
		logs.Printf(a.log, "%s: %v: the out-of-memory errors of PyTorch's own limits (set_per_process_memory_fraction) are not seen", lib.Path, err)
		return
	}
	a.mu.Lock()
	a.links = append(a.links, l)
	a.mu.Unlock()
	logs.Event(a.log, logs.Attached, fmt.Sprintf("attached to %s: PyTorch's out-of-memory report", lib.Path),
		"library", lib.Path, "kind", "oom_report", "probes", 1)
}

// attachInstalled attaches to the driver libraries installed on the node,
// before any process loads them: uprobes hold on the file, so a program
// started later is traced from its first driver call (its contexts, and so
// its GPU, included), where discovery would see it only at the next scan.
// The host's file system is searched too when the node's process 1 is
// readable (a DaemonSet with hostPID).
func (a *attacher) attachInstalled(procRoot string, dirs []string) {
	if dirs == nil {
		dirs = discover.DriverDirs
	}
	roots := []string{"/"}
	if host := filepath.Join(procRoot, "1", "root"); readableDir(host) {
		roots = append(roots, host)
	}
	for _, lib := range discover.Installed(roots, dirs) {
		if !a.shouldAttach(lib) {
			continue
		}
		if err := a.attach(lib); err != nil {
			logs.Printf(a.log, "%v (installed; processes that load it are attached when found)", err)
		}
	}
}

func readableDir(path string) bool {
	_, err := os.ReadDir(path)
	return err == nil
}

// attachFound attaches to the libraries a scan found, and says how many
// driver libraries it found.
func (a *attacher) attachFound(libs []discover.Library) (drivers int) {
	for _, lib := range libs {
		if lib.Allocator {
			a.attachOOMReport(lib)
		} else {
			drivers++
		}
		if !a.shouldAttach(lib) {
			continue
		}
		err := a.attach(lib)
		if err == nil || !a.firstFailure(lib, err) {
			continue
		}
		if errors.Is(err, tracer.ErrNoProbes) {
			logs.Printf(a.log, "%v: no tensor view for it, the driver view goes on", err)
		} else {
			logs.Printf(a.log, "%v (retrying)", err)
		}
	}
	return drivers
}

// firstFailure notes a library's failure to attach, and says whether it
// is its first.
func (a *attacher) firstFailure(lib discover.Library, err error) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.failed[lib.ID()] != nil {
		return false
	}
	a.failed[lib.ID()] = err
	return true
}

// shouldAttach says whether a library found by a scan is to be attached:
// not yet attached, not the driver when --library names it (allocators are
// still found), not an allocator with the tensor view off or without probes.
func (a *attacher) shouldAttach(lib discover.Library) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.attached[lib.ID()]; ok {
		return false
	}
	if a.library != "" && !lib.Allocator || a.tensors != TensorsAll && lib.Allocator {
		return false
	}
	return !errors.Is(a.failed[lib.ID()], tracer.ErrNoProbes)
}

func (a *attacher) attach(lib discover.Library) error {
	what, kind := "driver functions", "driver"
	var n int
	var err error
	if lib.Allocator {
		what, kind = "PyTorch allocator probes", "allocator"
		var p *tracer.AllocatorProbes
		if p, err = a.tr.AttachAllocator(lib.Path, 0); err == nil {
			a.mu.Lock()
			a.links = append(a.links, p)
			a.mu.Unlock()
			n = p.Sites
			what = "PyTorch allocator probes" + functionsFollowed(p)
		}
	} else {
		var symbols []string
		symbols, err = a.tr.Attach(lib.Path)
		n = len(symbols)
	}
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.attached[lib.ID()] = lib
	a.mu.Unlock()
	logs.Event(a.log, logs.Attached, fmt.Sprintf("attached to %s: %d %s", lib.Path, n, what), "library", lib.Path, "kind", kind, "probes", n)
	return nil
}

// close detaches the allocators' probes.
func (a *attacher) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range a.links {
		l.Close()
	}
	a.links = nil
}

// appendLibraries appends the paths of the libraries attached to dst,
// sorted.
func (a *attacher) appendLibraries(dst []string) []string {
	a.mu.Lock()
	for _, lib := range a.attached {
		dst = append(dst, lib.Path)
	}
	a.mu.Unlock()
	sort.Strings(dst)
	return dst
}
