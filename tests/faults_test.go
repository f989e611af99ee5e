package tests

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// Faults (issue 21, point 3): each one costs what it must, is counted and
// said once, and tracing goes on. docs/faults.md lists them.

// TestOnOOMFolderCheckedAtStart: an --on-oom folder that cannot take a
// snapshot is said at start, as -o's is, in one line, exit 2: nothing is
// recorded that a snapshot would then be lost from.
func TestOnOOMFolderCheckedAtStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
		want string
	}{
		{"under a file", []string{gpumem, "record", "--on-oom", "file/oom"}, "--on-oom file/oom: not a directory"},
		{"a file", []string{gpumem, "record", "--on-oom", "file"}, "--on-oom file: not a directory"},
		{"read-only", append(chartCaps(), gpumem, "record", "--on-oom", "read-only"),
			"--on-oom read-only: cannot write in folder read-only: permission denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
			cmd.Dir = t.TempDir()
			if err := os.Mkdir(filepath.Join(cmd.Dir, "read-only"), 0o555); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(cmd.Dir, "file"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("exit %v, want code 2; output:\n%s", err, out)
			}
			if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 || lines[0] != "gpumem: "+tc.want {
				t.Errorf("output %q, want the one line gpumem: %s", out, tc.want)
			}
			if entries, _ := os.ReadDir(filepath.Join(cmd.Dir, "read-only")); len(entries) != 0 {
				t.Errorf("left behind %v", entries)
			}
		})
	}
}

// TestOnOOMFolderLostDuringTheRecording: the --on-oom folder is removed
// after the first snapshot. The next two are lost whole (no file in
// part), the first loss said once with its cause, the count at the end;
// tracing goes on: the report has all three failures.
func TestOnOOMFolderLostDuringTheRecording(t *testing.T) {
	dir := t.TempDir()
	oomDir := filepath.Join(dir, "oom")
	r := startOOMRecording(t, dir, oomDir)
	var pids []int
	for i := range 3 {
		pid := r.oom()
		switch i {
		case 0:
			r.c.waitStderr(fmt.Sprintf("wrote %s and .folded", filepath.Join(oomDir, fmt.Sprintf("oom-%d-1.pb.gz", pid))))
			if err := os.RemoveAll(oomDir); err != nil {
				t.Fatal(err)
			}
		case 1:
			r.c.waitStderr(fmt.Sprintf("out-of-memory snapshot oom-%d-2 lost: create %s: no such file or directory", pid,
				filepath.Join(oomDir, fmt.Sprintf("oom-%d-2.pb.gz", pid))))
		}
		pids = append(pids, pid)
	}
	logs := r.stop()
	if n := count(logs, " lost: "); n != 1 {
		t.Errorf("a loss said %d times, want once", n)
	}
	if n := count(logs, "out-of-memory snapshots: 1 written, 2 lost ("+oomDir+" could not be written)"); n != 1 {
		t.Errorf("the count said %d times, want once", n)
	}
	if _, err := os.Stat(oomDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("snapshot folder back: %v", err)
	}
	if got := reportOOMPIDs(t, r.out); fmt.Sprint(got) != fmt.Sprint(pids) {
		t.Errorf("report's out-of-memory failures of pids %v, want %v", got, pids)
	}
}

// TestOnOOMFolderFull: the --on-oom folder is a 64 KiB tmpfs, full from
// the start. The first snapshot is lost with its cause said, the second
// lost silently; each leaves no file (the folder watched through inotify:
// the snapshot's first file created, then removed, nothing else). Space
// freed, the third is written whole, and the return said once with the
// count lost meanwhile; full again, the fourth is lost and said anew. At
// the end, the count; the report has all four failures.
func TestOnOOMFolderFull(t *testing.T) {
	dir := t.TempDir()
	oomDir := filepath.Join(dir, "oom")
	filler := fullTmpfs(t, oomDir)
	changes := watchFolder(t, oomDir)
	r := startOOMRecording(t, dir, oomDir)
	var pids []int
	for i := range 4 {
		if i == 2 {
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
		}
		if i == 3 {
			fill(t, filler)
		}
		pid := r.oom()
		base := fmt.Sprintf("oom-%d-%d", pid, i+1)
		want := []string{"+" + base + ".pb.gz", "-" + base + ".pb.gz"} // lost: nothing left
		switch i {
		case 0, 3:
			r.c.waitStderr(fmt.Sprintf("out-of-memory snapshot %s lost: write %s: no space left on device", base, filepath.Join(oomDir, base+".pb.gz")))
		case 2:
			r.c.waitStderr(fmt.Sprintf("wrote %s and .folded", filepath.Join(oomDir, base+".pb.gz")))
			want = []string{"+" + base + ".pb.gz", "+" + base + ".folded"}
		}
		if got := changes.next(t, len(want)); !slices.Equal(got, want) {
			t.Errorf("snapshot %d: the folder changed %v, want %v", i+1, got, want)
		}
		pids = append(pids, pid)
	}
	logs := r.stop()
	for s, n := range map[string]int{
		" lost: ": 2, // once for each time the folder filled up
		"out-of-memory snapshots written again in " + oomDir + " (2 lost while it could not be written)": 1,
		"out-of-memory snapshots written again":                                                          1,
		"out-of-memory snapshots: 1 written, 3 lost (" + oomDir + " could not be written)":               1,
	} {
		if got := count(logs, s); got != n {
			t.Errorf("%q said %d times, want %d", s, got, n)
		}
	}
	if got := changes.next(t, 0); len(got) != 0 {
		t.Errorf("the folder changed %v after the last snapshot", got)
	}
	third := filepath.Join(oomDir, fmt.Sprintf("oom-%d-3", pids[2]))
	var names []string
	entries, err := os.ReadDir(oomDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		names = append(names, filepath.Join(oomDir, e.Name()))
	}
	if want := []string{filler, third + ".folded", third + ".pb.gz"}; !slices.Equal(names, want) {
		t.Errorf("the folder holds %v, want %v", names, want)
	}
	if p := readProfile(t, third+".pb.gz"); len(p.Comments) == 0 || !strings.HasPrefix(p.Comments[0], fmt.Sprintf("out of memory: pid %d ", pids[2])) {
		t.Errorf("the written snapshot's comments: %q", p.Comments)
	}
	if got := reportOOMPIDs(t, r.out); fmt.Sprint(got) != fmt.Sprint(pids) {
		t.Errorf("report's out-of-memory failures of pids %v, want %v", got, pids)
	}
}

// oomRecording is gpumem record --on-oom on a test's own copy of the
// simulated driver (no other test's process loads it), with a JSON report.
type oomRecording struct {
	t      *testing.T
	c      *cli
	driver string
	env    []string // for simwork: the copy, a capacity of 1 MB
	out    string   // the report
	n      int      // workloads run
}

// startOOMRecording starts the recording, its files in dir, its snapshots
// in oomDir.
func startOOMRecording(t *testing.T, dir, oomDir string) *oomRecording {
	t.Helper()
	r := &oomRecording{t: t, driver: filepath.Join(dir, "driver", "libcuda.so.1"), out: filepath.Join(dir, "report.json")}
	copyFile(t, simLib, r.driver)
	r.env = []string{"LD_LIBRARY_PATH=" + filepath.Dir(r.driver), "SIMCUDA_CAPACITY=1000000"}
	r.c = startCLI(t, "record", "--library", r.driver, "--tensors=false", "--on-oom", oomDir, "--format", "json", "-o", r.out)
	r.c.waitEvent(logs.Recording)
	return r
}

// oom runs a workload whose allocation fails out of memory, and returns
// its pid once gpumem has said so (its snapshot is written, or lost,
// right after).
func (r *oomRecording) oom() int {
	r.t.Helper()
	w := startWorkload(r.t, r.env, simwork, "oom", "2000000")
	if r.n++; r.n == 1 {
		r.c.waitEvent(logs.Attached, "library", r.driver)
	}
	if expect := w.run(); expect["result"] != 2 { // CUDA_ERROR_OUT_OF_MEMORY
		r.t.Fatalf("workload: %v", expect)
	}
	r.c.waitStderr(fmt.Sprintf("out of memory: pid %d ", w.pid))
	w.exit()
	return w.pid
}

// stop stops the recording as Ctrl-C would, its last line read before it
// is waited for, and returns every line it logged.
func (r *oomRecording) stop() []string {
	r.t.Helper()
	r.c.cmd.Process.Signal(os.Interrupt)
	r.c.waitStderr("wrote " + r.out)
	if err := r.c.cmd.Wait(); err != nil {
		r.t.Fatalf("gpumem: %v", err)
	}
	r.c.stderr.mu.Lock()
	defer r.c.stderr.mu.Unlock()
	return slices.Clone(r.c.stderr.lines)
}

// fullTmpfs mounts a 64 KiB tmpfs at dir (created), unmounted at the
// test's end, and fills it with one file, whose path it returns.
func fullTmpfs(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatalf("mount tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	filler := filepath.Join(dir, "filler")
	fill(t, filler)
	return filler
}

// fill writes path until its file system says it is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	page := make([]byte, 4096)
	for {
		if _, err := f.Write(page); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", path, err)
			}
			return
		}
	}
}

// folderChanges are the names created (+NAME) and removed (-NAME) in a
// folder, from inotify, in order: files beginning with "oom-" only.
type folderChanges chan string

// watchFolder watches dir until the test's end.
func watchFolder(t *testing.T, dir string) folderChanges {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_DELETE); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: Close ends a Read
	changes := make(folderChanges, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
				off += unix.SizeofInotifyEvent + int(ev.Len)
				if !strings.HasPrefix(name, "oom-") {
					continue
				}
				if ev.Mask&unix.IN_CREATE != 0 {
					changes <- "+" + name
				} else {
					changes <- "-" + name
				}
			}
		}
	}()
	t.Cleanup(func() { f.Close(); <-done })
	return changes
}

// next returns the next n changes, and any that came beyond them by now.
func (c folderChanges) next(t *testing.T, n int) []string {
	t.Helper()
	var got []string
	deadline := time.After(hangLimit)
	for len(got) < n {
		select {
		case name := <-c:
			got = append(got, name)
		case <-deadline:
			t.Fatalf("the folder changed %v, waited for %d changes", got, n)
		}
	}
	for {
		select {
		case name := <-c:
			got = append(got, name)
		default:
			return got
		}
	}
}

// reportOOMPIDs reads a JSON report's out-of-memory failures: their pids,
// in order.
func reportOOMPIDs(t *testing.T, path string) []int {
	t.Helper()
	var r struct {
		OOMs []struct {
			Failure struct {
				PID int `json:"pid"`
			} `json:"failure"`
		} `json:"out_of_memory"`
	}
	readJSON(t, path, &r)
	var pids []int
	for _, o := range r.OOMs {
		pids = append(pids, o.Failure.PID)
	}
	return pids
}

// readJSON decodes the JSON file at path into v.
func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// count is how many lines hold s.
func count(lines []string, s string) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// TestKilledInsideTheDriverLeavesNoBooks: the in-flight map and the books,
// on this test's own driver. A process killed while inside cuMemAlloc_v2 leaves no
// call in flight, no allocation counted (the call never returned) and no
// live bytes; nothing is lost, and the next process is traced exactly.
func TestKilledInsideTheDriverLeavesNoBooks(t *testing.T) {
	driver := filepath.Join(t.TempDir(), "driver", "libcuda.so.1")
	copyFile(t, simLib, driver) // this test's own driver: no other test's process loads it
	env := []string{"LD_LIBRARY_PATH=" + filepath.Dir(driver)}
	s := startProfiler(t, profiler.Config{Library: driver, Tensors: profiler.TensorsOff})
	s.waitEvent(logs.Attached, "library", driver)
	tr, err := tracer.New(tracer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if _, err := tr.Attach(driver); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(simwork, "hold", "777")
	cmd.Env = append(cmd.Environ(), append(env, "SIMCUDA_HANG_BYTES=777", "SIMWORK_NOWAIT=1")...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitInFlight(t, tr, 1)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	waitInFlight(t, tr, 0)

	w := startWorkload(t, env, simwork, "hold", "4096")
	w.run()
	r := s.report()
	killed, next := map[string]uint64{}, map[string]uint64{}
	for _, row := range r.Rows() {
		var m map[string]uint64
		switch row.PID {
		case uint32(cmd.Process.Pid):
			m = killed
		case uint32(w.pid):
			m = next
		default:
			continue
		}
		m["allocs"] += row.AllocCount
		m["alloc_bytes"] += row.AllocBytes
		m["live_bytes"] += row.LiveBytes()
	}
	if killed["allocs"] != 0 || killed["live_bytes"] != 0 {
		t.Errorf("the killed process's books: %v, want nothing", killed)
	}
	if want := map[string]uint64{"allocs": 1, "alloc_bytes": 4096, "live_bytes": 4096}; fmt.Sprint(next) != fmt.Sprint(want) {
		t.Errorf("the next process's books: %v, want %v", next, want)
	}
	assertNoLosses(t, r)
	w.exit()
}

// waitInFlight waits until the tracer counts want calls in flight.
func waitInFlight(t *testing.T, tr *tracer.Tracer, want int) {
	t.Helper()
	waitfor.Value(t, fmt.Sprintf("%d calls in flight", want), hangLimit, func() int {
		n, err := tr.InFlight()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}, func(n int) bool { return n == want })
}
