package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpu-mem/gpu-mem/pprof"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/report"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// oomWriter writes each out-of-memory snapshot into a directory: what the
// process held, as pprof (oom-PID-N.pb.gz, both views as sample types) and
// folded, one file per view: the driver view in oom-PID-N.folded and, if the
// process held tensors, the tensor view in oom-PID-N.tensor.folded.
type oomWriter struct {
	dir string
	n   int
}

func (w *oomWriter) write(o profiler.OOM) {
	w.n++
	logf("%s", report.DescribeOOM(o))
	base := filepath.Join(w.dir, fmt.Sprintf("oom-%d-%d", o.Failure.PID, w.n))
	r := profiler.Report{Time: o.Time, Rows: o.Held}
	prof := pprof.Build(r)
	prof.Comments = []string{report.DescribeOOM(o), "asked from: " + strings.Join(frameNames(o.Failure), " < ")}
	files := map[string]func(f *os.File) error{
		base + ".pb.gz":  func(f *os.File) error { return prof.Write(f) },
		base + ".folded": func(f *os.File) error { return report.WriteFolded(f, r, report.InUse, tracer.ViewDriver) },
	}
	written := "wrote " + base + ".pb.gz and .folded"
	if report.HasTensors(r.Rows) {
		files[base+".tensor.folded"] = func(f *os.File) error { return report.WriteFolded(f, r, report.InUse, tracer.ViewTensor) }
		written = "wrote " + base + ".pb.gz, .folded (driver view) and .tensor.folded (tensor view)"
	}
	for path, write := range files {
		if err := writeFile(path, write); err != nil {
			logf("out-of-memory snapshot: %v", err)
			return
		}
	}
	logf("%s", written)
}

func frameNames(f profiler.Failure) []string {
	names := make([]string, len(f.Frames))
	for i, fr := range f.Frames {
		names[i] = fr.Name()
	}
	return names
}

func writeFile(path string, write func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
