package discover

import (
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkScan is one scan of 1,000 idle processes an hour old, each
// mapping 100 libraries, at the agent's pace (a scan every 500 ms): the
// Scanner, which reads a process's stat every 30 s at most and its maps
// only when the stat changed, against the full rescan it replaced, which
// reads every process's maps at every scan. bench's discovery section
// measures the same on real processes, with the agent's CPU.
func BenchmarkScan(b *testing.B) {
	f := newFakeProcs(b, "")
	var maps []string
	for i := range 100 {
		maps = append(maps, fmt.Sprintf("7f%04x0000-7f%04x8000 r-xp 00000000 fd:01 %d /usr/lib/x86_64-linux-gnu/lib%d.so", i, i, 1000+i, i))
	}
	const processes = 1000
	const scanEvery = 500 * time.Millisecond // the profiler's scan interval
	for pid := 1; pid <= processes; pid++ {
		f.write(pid, fakeProc{comm: "sleep", start: time.Second, vsize: 1 << 20, code: 1, maps: maps})
	}
	b.Run("scanner", func(b *testing.B) {
		f.now = time.Hour
		if _, err := f.s.Scan(nil); err != nil { // every process new: read once, as the agent does
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			f.now += scanEvery
			if _, err := f.s.Scan(nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("full", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if r, err := Scan(f.root, nil); err != nil || len(r.Libraries) != 0 {
				b.Fatalf("%v libraries, %v", r.Libraries, err)
			}
		}
	})
}

// BenchmarkReadStat is one read of a real process's stat: through the file
// a Scanner holds open, against opening, reading and closing it, as a
// Scanner of a test's tree (or past its limit of held files) does.
func BenchmarkReadStat(b *testing.B) {
	pid := os.Getpid()
	buf := make([]byte, listBuffer)
	b.Run("held", func(b *testing.B) {
		fd, _, err := openFileOf("/proc", pid, "stat", buf)
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Close(fd)
		for b.Loop() {
			if readAt0(fd, buf) == nil {
				b.Fatal("read failed")
			}
		}
	})
	b.Run("opened", func(b *testing.B) {
		for b.Loop() {
			if _, err := readFileOf("/proc", pid, "stat", buf); err != nil {
				b.Fatal(err)
			}
		}
	})
}
