package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpu-mem/gpu-mem/profiler"
)

// attachLatency starts processes that load a copy of the driver no process
// had mapped (a new inode to find and attach to) and allocate from their
// first instant; the latency is from the process's start to gpu-mem's first
// accounted allocation of it.
func attachLatency() string {
	var lat []float64
	for i := range runs {
		lat = append(lat, attachOnce(i))
	}
	l := median(lat)
	var b strings.Builder
	b.WriteString("gpu-mem runs with discovery (no --library); a process starts with a fresh copy of the\n")
	b.WriteString("driver at a new path and allocates continuously. Latency: from its start to the first\n")
	b.WriteString("allocation of it that gpu-mem accounts (scans run every 500 ms).\n\n")
	fmt.Fprintf(&b, "| median | runs |\n| ---: | --- |\n| %.0f ms | %s |\n", l*1000, joinMillis(lat))
	fmt.Fprintf(&b, "\nTarget: at most 1 second: %s.\n", verdict(l <= 1))
	return b.String()
}

func attachOnce(i int) float64 {
	dir, err := os.MkdirTemp("", "gpumem-latency")
	check(err)
	defer os.RemoveAll(dir)
	data, err := os.ReadFile(simLib)
	check(err)
	check(os.WriteFile(filepath.Join(dir, "libcuda.so.1"), data, 0o755))

	p, err := profiler.New(profiler.Config{})
	check(err)
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(time.Duration(100+i*137%400) * time.Millisecond) // start at varied points of the scan cycle

	cmd := exec.Command(simwork, "threads", "1", "3", "2000")
	cmd.Env = append(os.Environ(), "SIMWORK_NOWAIT=1", "LD_LIBRARY_PATH="+dir)
	start := time.Now()
	check(cmd.Start())
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	for time.Since(start) < 3*time.Second {
		r, err := p.Snapshot()
		check(err)
		for _, row := range r.Rows() {
			if int(row.PID) == cmd.Process.Pid {
				return time.Since(start).Seconds()
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 3
}

func joinMillis(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.0f", x*1000)
	}
	return strings.Join(parts, ", ") + " ms"
}
