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
	driver := filepath.Join(dir, "driver", "libcuda.so.1")
	copyFile(t, simLib, driver) // this test's own driver: no other test's process loads it
	env := []string{"LD_LIBRARY_PATH=" + filepath.Dir(driver), "SIMCUDA_CAPACITY=1000000"}
	oomDir := filepath.Join(dir, "oom")
	out := filepath.Join(dir, "report.json")
	c := startCLI(t, "record", "--library", driver, "--tensors=false", "--on-oom", oomDir, "--format", "json", "-o", out)
	c.waitStderr("recording")

	var pids []int
	for i := range 3 {
		w := startWorkload(t, env, simwork, "oom", "2000000")
		if i == 0 {
			c.waitStderr("attached to " + driver)
		}
		if expect := w.run(); expect["result"] != 2 { // CUDA_ERROR_OUT_OF_MEMORY
			t.Fatalf("workload: %v", expect)
		}
		c.waitStderr(fmt.Sprintf("out of memory: pid %d ", w.pid))
		switch i {
		case 0:
			c.waitStderr(fmt.Sprintf("wrote %s and .folded", filepath.Join(oomDir, fmt.Sprintf("oom-%d-1.pb.gz", w.pid))))
			if err := os.RemoveAll(oomDir); err != nil {
				t.Fatal(err)
			}
		case 1:
			c.waitStderr(fmt.Sprintf("out-of-memory snapshot oom-%d-2 lost: create %s: no such file or directory", w.pid,
				filepath.Join(oomDir, fmt.Sprintf("oom-%d-2.pb.gz", w.pid))))
		}
		pids = append(pids, w.pid)
		w.exit()
	}
	// Stopped as Ctrl-C would; its last line read before it is waited for.
	c.cmd.Process.Signal(os.Interrupt)
	c.waitStderr("wrote " + out)
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("gpumem: %v", err)
	}
	c.stderr.mu.Lock()
	logs := slices.Clone(c.stderr.lines)
	c.stderr.mu.Unlock()
	if n := count(logs, " lost: "); n != 1 {
		t.Errorf("a loss said %d times, want once", n)
	}
	if n := count(logs, "out-of-memory snapshots: 1 written, 2 lost ("+oomDir+" could not be written)"); n != 1 {
		t.Errorf("the count said %d times, want once", n)
	}
	if _, err := os.Stat(oomDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("snapshot folder back: %v", err)
	}
	var r struct {
		OOMs []struct {
			Failure struct {
				PID int `json:"pid"`
			} `json:"failure"`
		} `json:"out_of_memory"`
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, o := range r.OOMs {
		got = append(got, o.Failure.PID)
	}
	if fmt.Sprint(got) != fmt.Sprint(pids) {
		t.Errorf("report's out-of-memory failures of pids %v, want %v", got, pids)
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
	s := startProfiler(t, profiler.Config{Library: driver, NoTensors: true})
	s.waitLog("attached to " + driver)
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
	for _, row := range r.Rows {
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
	deadline := time.Now().Add(hangLimit)
	for {
		n, err := tr.InFlight()
		if err != nil {
			t.Fatal(err)
		}
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls in flight, want %d", n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
