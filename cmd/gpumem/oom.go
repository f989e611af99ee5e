package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpu-mem/gpu-mem/breakdown"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/pprof"
	"github.com/gpu-mem/gpu-mem/report"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// oomWriter writes each out-of-memory snapshot into a directory: what the
// process held, as pprof (oom-PID-N.pb.gz, both views as sample types) and
// folded, one file per view: the driver view in oom-PID-N.folded and, if the
// process held tensors, the tensor view in oom-PID-N.tensor.folded. A
// snapshot that cannot be written (the directory removed, its file system
// full or read-only during the recording) is lost whole, none of its files
// left, and counted. The loss is said once with its cause, not at every
// snapshot: then, once a snapshot is written again (space freed), that is
// said once with the count lost meanwhile, and a later loss is said anew.
// The count is said at the end; tracing goes on.
type oomWriter struct {
	dir     string
	rules   *breakdown.Rules // for each one's verdict
	n       int
	written int
	lost    int
	failing int // snapshots lost since the last one written
}

func (w *oomWriter) write(o snapshot.OOM) {
	w.n++
	o.Verdict = breakdown.Judge(&o, w.rules)
	logf("%s", report.DescribeOOM(o))
	base := filepath.Join(w.dir, fmt.Sprintf("oom-%d-%d", o.Failure.PID, w.n))
	r := o.Snapshot()
	comments := []string{report.DescribeOOM(o), "asked from: " + strings.Join(frameNames(o.Failure), " < ")}
	paths := []string{base + ".pb.gz", base + ".folded"}
	writers := []func(io.Writer) error{
		func(f io.Writer) error { return pprof.Write(f, r, comments...) },
		func(f io.Writer) error { return report.WriteFolded(f, r, report.InUse, memory.ViewDriver) },
	}
	written := "wrote " + base + ".pb.gz and .folded"
	if report.HasTensors(o.Held) {
		paths = append(paths, base+".tensor.folded")
		writers = append(writers, func(f io.Writer) error { return report.WriteFolded(f, r, report.InUse, memory.ViewTensor) })
		written = "wrote " + base + ".pb.gz, .folded (driver view) and .tensor.folded (tensor view)"
	}
	for i, path := range paths {
		if err := writeFileAt(path, writers[i]); err != nil {
			for _, done := range paths[:i] {
				os.Remove(done) // no snapshot in part
			}
			w.lose(base, err)
			return
		}
	}
	w.written++
	if w.failing > 0 {
		logf("out-of-memory snapshots written again in %s (%d lost while it could not be written)", w.dir, w.failing)
		w.failing = 0
	}
	logf("%s", written)
}

// lose counts a snapshot lost; the first of a run of losses says why.
func (w *oomWriter) lose(base string, err error) {
	w.lost++
	w.failing++
	if w.failing == 1 {
		logf("out-of-memory snapshot %s lost: %v (losses are counted until one is written again, said at the end)", filepath.Base(base), err)
	}
}

// summary says, at the end, how many snapshots were lost, if any.
func (w *oomWriter) summary() {
	if w.lost > 0 {
		logf("out-of-memory snapshots: %d written, %d lost (%s could not be written)", w.written, w.lost, w.dir)
	}
}

func frameNames(f snapshot.Failure) []string {
	names := make([]string, len(f.Frames))
	for i, fr := range f.Frames {
		names[i] = fr.Name()
	}
	return names
}
