package tests

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/tests/podsecurity"
)

// TestEachCapabilityIsNeeded: gpumem run as the chart's DaemonSet runs the
// agent (tests/kubernetes runs the agent itself so), with each of the
// chart's capabilities taken away in turn, records a Python process (its
// Python frames) and a C one whose binary was deleted after it started
// (its frames named from /proc/PID/map_files). With all of them both are
// named; without each, something is lost, and gpumem says what, once:
// without CAP_BPF or CAP_PERFMON it cannot load its program and says so
// in one line, exiting 2.
func TestEachCapabilityIsNeeded(t *testing.T) {
	chart, err := podsecurity.FromChart(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	covered := []string{}
	const python = `;<module>;main;sites;Model.method;cuda_malloc;.*cuMemAlloc_v2 1002$`
	const deleted = `^simwork;gpu=[^;]+;.*;main;kinds;alloc_device;cuMemAlloc_v2 3145728$`
	for _, tc := range []struct {
		without string
		says    string   // the line said once; for an exit, its first line
		exits   bool     // with code 2, at once
		named   []string // folded lines, as patterns
		lost    []string // patterns of lines not there
	}{
		{without: "", named: []string{python, deleted}},
		{without: "BPF", says: "needs root (CAP_BPF and CAP_PERFMON)", exits: true},
		{without: "PERFMON", says: "needs root (CAP_BPF and CAP_PERFMON)", exits: true},
		{without: "SYS_PTRACE", says: "without CAP_SYS_PTRACE: processes of other users, or with capabilities gpumem lacks " +
			"(those of other containers), cannot be read: their driver libraries are not attached, their Python frames and GPU ordinals are unknown",
			lost: []string{python, deleted}},
		{without: "CHECKPOINT_RESTORE", says: "without CAP_CHECKPOINT_RESTORE: /proc/PID/map_files cannot be opened: " +
			"files deleted or replaced since a process mapped them are not symbolized",
			named: []string{python, `^simwork;gpu=[^;]+;.*;simwork\+0x[0-9a-f]+;cuMemAlloc_v2 3145728$`}, lost: []string{deleted}},
	} {
		name := "with the chart's capabilities"
		if tc.without != "" {
			name = "without " + tc.without
			covered = append(covered, tc.without)
		}
		t.Run(name, func(t *testing.T) {
			sc := chart
			if tc.without != "" {
				sc = chart.Without(tc.without)
				if len(sc.Add) == len(chart.Add) {
					t.Fatalf("the chart does not add %s: %v", tc.without, chart.Add)
				}
			}
			py := startWorkload(t, []string{"SIMCUDA_LIB=" + simLib}, "/root/.pyenv/versions/3.12.1/bin/python3.12",
				filepath.Join(repoRoot, "tests/workloads/simwork.py"), "sites")
			c := startDeleted(t)
			cmd, err := sc.Command(gpumem, jsonLog, "record", "--pid", strconv.Itoa(py.pid), "--pid", strconv.Itoa(c.pid),
				"--format", "folded", "--value", "alloc", "-o", "-", "--top", "0")
			if err != nil {
				t.Fatal(err)
			}
			if tc.exits {
				out, err := cmd.CombinedOutput()
				var exit *exec.ExitError
				if first, _, _ := strings.Cut(string(out), "\n"); !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(first, tc.says) {
					t.Fatalf("exit %v, first line %q; want code 2 and %q", err, first, tc.says)
				}
				return
			}
			r := startCommandLine(t, cmd)
			r.waitEvent(logs.Recording)
			if tc.without == "SYS_PTRACE" {
				r.waitStderr(fmt.Sprintf("no Python frames for pid %d", py.pid))
				r.waitStderr("permission denied (retrying)")
			} else {
				r.waitEvent(logs.Python, "pid", py.pid, "version", "3.12")
				r.waitEvent(logs.Attached, "library", fmt.Sprintf("/proc/%d/root%s", py.pid, simLib))
				r.waitEvent(logs.Attached, "library", fmt.Sprintf("/proc/%d/root%s", c.pid, filepath.Join(filepath.Dir(c.cmd.Path), "libcuda.so.1")))
			}
			py.run()
			c.run()
			r.interrupt()
			py.exit()
			c.exit()

			folded := r.stdout.String()
			for _, want := range tc.named {
				if !matchLine(folded, want) {
					t.Errorf("no line matching %q:\n%s", want, folded)
				}
			}
			for _, lost := range tc.lost {
				if matchLine(folded, lost) {
					t.Errorf("a line matching %q without %s:\n%s", lost, tc.without, folded)
				}
			}
			for range r.lines { // to the last line
			}
			r.stderr.mu.Lock()
			defer r.stderr.mu.Unlock()
			said := 0
			for _, line := range r.stderr.lines {
				if strings.Contains(line, "without CAP_") {
					said++
					if tc.says == "" || !strings.Contains(line, tc.says) {
						t.Errorf("said %q", line)
					}
				}
			}
			if tc.says != "" && said != 1 {
				t.Errorf("said %q %d times, want once", tc.says, said)
			}
		})
	}
	// A capability the chart adds is here with what it is needed for.
	slices.Sort(covered)
	if added := slices.Sorted(slices.Values(chart.Add)); !slices.Equal(covered, added) {
		t.Errorf("the chart adds %v; this test shows what %v are needed for", added, covered)
	}
}

// startDeleted starts simwork's kinds scenario from a copy of simwork and
// the driver, and deletes the copy of simwork once it runs: its frames can
// be named only from the file it maps, /proc/PID/map_files.
func startDeleted(t *testing.T) *workload {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{simwork, simLib} {
		copyFile(t, f, filepath.Join(dir, filepath.Base(f)))
	}
	w := startWorkload(t, nil, filepath.Join(dir, "simwork"), "kinds")
	if err := os.Remove(filepath.Join(dir, "simwork")); err != nil {
		t.Fatal(err)
	}
	return w
}
