package profiler

import (
	"time"

	"golang.org/x/sys/unix"
)

// bpfNow is the time on the clock of BPF timestamps (bpf_ktime_get_ns).
func bpfNow() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // the clock exists on every Linux
	}
	return uint64(ts.Nano())
}

// wallTime is a BPF timestamp on the wall clock.
func wallTime(ts uint64) time.Time {
	return time.Now().Add(-time.Duration(int64(bpfNow()) - int64(ts)))
}
