// Command nvmlcost measures what one read of NVML costs the agent: every
// GPU's memory and process list (nvml.NVML.Read, what the profiler's
// sampling job does at each scan, context made and snapshot), on the
// driver's libnvidia-ml.so.1 or the simulated one. Build it without cgo,
// as the agent is: CGO_ENABLED=0 go build ./bench/nvmlcost.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/gpu-mem/gpu-mem/nvml"
)

func main() {
	lib := flag.String("library", nvml.Library, "the NVML library")
	reads := flag.Int("reads", 1000, "reads to time")
	flag.Parse()
	d, processes, err := measure(*lib, *reads)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nvmlcost: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("nvml read: median %.1f us over %d reads (%d processes listed)\n", float64(d.Nanoseconds())/1e3, *reads, processes)
}

// measure is the median time of one Read over reads, and how many
// processes the last listed.
func measure(lib string, reads int) (time.Duration, int, error) {
	n, err := nvml.Open(lib)
	if err != nil {
		return 0, 0, err
	}
	defer n.Close()
	var s nvml.Sample
	times := make([]time.Duration, 0, reads)
	for range reads {
		start := time.Now()
		if err := n.Read(&s); err != nil {
			return 0, 0, err
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	processes := 0
	for _, g := range s.GPUs {
		processes += len(g.Processes)
	}
	return times[len(times)/2], processes, nil
}
