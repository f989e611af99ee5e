package tests

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// site names a row: the driver function and the function that called it.
type site struct{ driver, caller string }

// rowsBySite sums a process's rows per site: two calls in one function are
// two stacks (their return addresses differ) but one site.
func rowsBySite(t *testing.T, r *snapshot.Snapshot, pid int) map[site]snapshot.Row {
	t.Helper()
	rows := map[site]snapshot.Row{}
	for _, row := range r.Rows() {
		if row.PID != uint32(pid) {
			continue
		}
		if len(row.Frames) < 2 {
			t.Fatalf("stack too short: %+v", row.Frames)
		}
		s := site{row.Frames[0].Function, row.Frames[1].Function}
		if sum, ok := rows[s]; ok {
			row.Counters.Add(sum.Counters)
		}
		rows[s] = row
	}
	return rows
}

// processTotals sums every row of a process.
func processTotals(r *snapshot.Snapshot, pid int) accounting.Counters {
	var c accounting.Counters
	for _, row := range r.Rows() {
		if row.PID == uint32(pid) {
			c.Add(row.Counters)
		}
	}
	return c
}

func assertNoLosses(t *testing.T, r *snapshot.Snapshot) {
	t.Helper()
	if r.Losses.Total() != 0 {
		t.Errorf("losses: %+v", r.Losses)
	}
}

// TestEveryCallExact runs every traced allocation and free function once
// with known sizes, and checks the books row by row.
func TestEveryCallExact(t *testing.T) {
	w := startWorkload(t, nil, simwork, "kinds") // allocates one buffer before the tracer attaches
	s := startProfiler(t, profiler.Config{Library: simLib}, w)
	w.run()
	r := s.report()

	const MiB = 1 << 20
	want := map[site]struct {
		kind memory.Kind
		c    accounting.Counters
	}{
		{"cuMemAlloc_v2", "alloc_device"}:                   {memory.KindDevice, accounting.Counters{AllocBytes: 3 * MiB, AllocCount: 3, FreeBytes: MiB, FreeCount: 1}},
		{"cuMemAllocPitch_v2", "alloc_pitched"}:             {memory.KindDevice, accounting.Counters{AllocBytes: 1024 * 30, AllocCount: 1}},
		{"cuMemAllocManaged", "alloc_managed"}:              {memory.KindManaged, accounting.Counters{AllocBytes: 2 * MiB, AllocCount: 1}},
		{"cuMemAllocHost_v2", "alloc_host"}:                 {memory.KindHost, accounting.Counters{AllocBytes: 4096, AllocCount: 1}},
		{"cuMemHostAlloc", "alloc_host"}:                    {memory.KindHost, accounting.Counters{AllocBytes: 8192, AllocCount: 1, FreeBytes: 8192, FreeCount: 1}},
		{"cuMemAllocAsync", "alloc_async"}:                  {memory.KindDevice, accounting.Counters{AllocBytes: 2 * 65536, AllocCount: 2, FreeBytes: 65536, FreeCount: 1}},
		{"cuMemAllocAsync_ptsz", "alloc_async"}:             {memory.KindDevice, accounting.Counters{AllocBytes: 32768, AllocCount: 1, FreeBytes: 32768, FreeCount: 1}},
		{"cuMemAllocFromPoolAsync", "alloc_async"}:          {memory.KindDevice, accounting.Counters{AllocBytes: 131072, AllocCount: 1}},
		{"cuMemAllocFromPoolAsync_ptsz", "alloc_pool_ptsz"}: {memory.KindDevice, accounting.Counters{AllocBytes: 16384, AllocCount: 1, FreeBytes: 16384, FreeCount: 1}},
		{"cuMemCreate", "alloc_vmm"}:                        {memory.KindVMM, accounting.Counters{AllocBytes: 6 * MiB, AllocCount: 2, FreeBytes: 2 * MiB, FreeCount: 1}},
	}
	got := rowsBySite(t, r, w.pid)
	if len(got) != len(want) {
		t.Errorf("got %d rows, want %d: %v", len(got), len(want), got)
	}
	var live, wantLive uint64
	for s, w := range want {
		row, ok := got[s]
		if !ok {
			t.Errorf("no row for %s called from %s", s.driver, s.caller)
			continue
		}
		if row.Kind != w.kind || row.Counters != w.c {
			t.Errorf("%s from %s: %s %+v, want %s %+v", s.driver, s.caller, row.Kind, row.Counters, w.kind, w.c)
		}
		live += row.LiveBytes()
		wantLive += w.c.AllocBytes - w.c.FreeBytes
	}
	if live != wantLive || live != 2*MiB+30720+2*MiB+4096+65536+131072+4*MiB {
		t.Errorf("live bytes %d, want %d", live, wantLive)
	}
	// The whole stack of one site, innermost first, down to main.
	stack := got[site{"cuMemAlloc_v2", "alloc_device"}].Frames
	for i, fn := range []string{"cuMemAlloc_v2", "alloc_device", "kinds", "main"} {
		if i >= len(stack) || stack[i].Function != fn {
			t.Fatalf("stack %v, want it to start with cuMemAlloc_v2 <- alloc_device <- kinds <- main", stack)
		}
	}
	// Frees are reported at their entry, their result unread: the free
	// the driver refuses is a free of a pointer never allocated.
	if r.Ledger.UnknownFrees != 2 || r.Ledger.UnknownFreesBy["cuMemFree_v2"] != 2 {
		t.Errorf("unknown frees %d by %v, want 2 of cuMemFree_v2: allocated before attach, refused",
			r.Ledger.UnknownFrees, r.Ledger.UnknownFreesBy)
	}
	assertNoLosses(t, r)
	w.exit()
}

// TestEightThreadsExact has eight threads allocate and free for seconds and
// compares the books with what the workload counted itself. Each thread
// makes 5,000 allocations and frees a second (80,000 events/s in all): the
// benchmark, not this test, finds the highest rate without loss.
func TestEightThreadsExact(t *testing.T) {
	w := startWorkload(t, nil, simwork, "threads", "8", "3", "5000")
	s := startProfiler(t, profiler.Config{Library: simLib}, w)
	expect := w.run()
	r := s.report()

	c := processTotals(r, w.pid)
	want := accounting.Counters{
		AllocBytes: expect["alloc_bytes"], AllocCount: expect["allocs"],
		FreeBytes: expect["freed_bytes"], FreeCount: expect["frees"],
	}
	if c != want || want.AllocCount < 8*5000*2 {
		t.Errorf("books %+v, workload counted %+v", c, want)
	}
	if live := c.LiveBytes(); live != want.AllocBytes-want.FreeBytes {
		t.Errorf("live %d", live)
	}
	t.Logf("%d allocations and %d frees in 3s", c.AllocCount, c.FreeCount)
	assertNoLosses(t, r)
	if r.Ledger.UnknownFrees != 0 {
		t.Errorf("unknown frees: %d", r.Ledger.UnknownFrees)
	}
	w.exit()
}

// TestExitReleasesHeldMemory: a process that exits holding memory gets an
// implicit free, and its live bytes go back to zero.
func TestExitReleasesHeldMemory(t *testing.T) {
	w := startWorkload(t, nil, simwork, "hold", "123456789")
	s := startProfiler(t, profiler.Config{Library: simLib}, w)
	w.run()
	row := rowsBySite(t, s.report(), w.pid)[site{"cuMemAlloc_v2", "hold"}]
	if row.LiveBytes() != 123456789 {
		t.Fatalf("live before exit: %d", row.LiveBytes())
	}
	w.exit()
	r := s.report()
	row = rowsBySite(t, r, w.pid)[site{"cuMemAlloc_v2", "hold"}]
	want := accounting.Counters{AllocBytes: 123456789, AllocCount: 1, ImplicitFreeBytes: 123456789, ImplicitFreeCount: 1}
	if row.Counters != want || row.LiveBytes() != 0 {
		t.Errorf("after exit %+v, want %+v", row.Counters, want)
	}
	if r.Ledger.ProcessExits != 1 {
		t.Errorf("process exits: %d", r.Ledger.ProcessExits)
	}
	assertNoLosses(t, r)
}

// TestOutOfMemoryIsAFailure: a request over the capacity is a failure event
// with code 2, its bytes and stack, and no allocation.
func TestOutOfMemoryIsAFailure(t *testing.T) {
	w := startWorkload(t, []string{"SIMCUDA_CAPACITY=1000000"}, simwork, "oom", "1000001")
	s := startProfiler(t, profiler.Config{Library: simLib}, w)
	if got := w.run()["result"]; got != memory.CUDAOutOfMemory {
		t.Fatalf("driver returned %d", got)
	}
	r := s.report()
	if rows := rowsBySite(t, r, w.pid); len(rows) != 0 {
		t.Errorf("failed call counted as allocation: %v", rows)
	}
	var failures []snapshot.Failure
	for _, f := range r.Failures {
		if f.PID == uint32(w.pid) {
			failures = append(failures, f)
		}
	}
	if len(failures) != 1 {
		t.Fatalf("failures %+v", failures)
	}
	f := failures[0]
	if f.Result != 2 || f.Bytes != 1000001 || f.Count != 1 || f.Op.Symbol() != "cuMemAlloc_v2" || f.Kind != memory.KindDevice {
		t.Errorf("failure %+v", f)
	}
	if len(f.Frames) < 2 || f.Frames[1].Function != "allocate_too_much" {
		t.Errorf("failure stack %v", f.Frames)
	}
	w.exit()
}

// TestLateProcessAtUnusualPath: with discovery, a process started after the
// tracer, loading a copy of the driver from an unusual path, is found and
// traced. (How soon is the scan interval's business, 500 ms by default; a
// test on a loaded machine cannot time it.)
func TestLateProcessAtUnusualPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "elsewhere")
	copyFile(t, simLib, filepath.Join(dir, "libcuda.so.1"))
	s := startProfiler(t, profiler.Config{PIDs: nil})

	w := startWorkload(t, []string{"LD_LIBRARY_PATH=" + dir}, simwork, "hold", "4096")
	s.waitEvent(logs.Attached, "library", fmt.Sprintf("/proc/%d/root%s", w.pid, filepath.Join(dir, "libcuda.so.1")))
	w.run()
	row := rowsBySite(t, s.report(), w.pid)[site{"cuMemAlloc_v2", "hold"}]
	if row.AllocBytes != 4096 || row.Frames[0].Module == "" {
		t.Errorf("row %+v", row)
	}
	w.exit()
}

// TestInstalledDriverTracedFromFirstCall: with discovery, the driver
// libraries installed on the node are attached before any process loads
// them, so a program started later is traced from its first driver call,
// its contexts (and so its GPUs) included, even one that lives a few
// milliseconds, far less than a scan's interval.
func TestInstalledDriverTracedFromFirstCall(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "driver")
	copyFile(t, simLib, filepath.Join(dir, "libcuda.so.1"))
	s := startProfiler(t, profiler.Config{DriverDirs: []string{dir}, ScanInterval: time.Hour})
	s.waitEvent(logs.Attached, "library", filepath.Join(dir, "libcuda.so.1"))

	w := exec.Command(simwork, "devices")
	w.Env = append(os.Environ(), "SIMWORK_NOWAIT=1", "SIMCUDA_DEVICES=3", "LD_LIBRARY_PATH="+dir)
	if out, err := w.CombinedOutput(); err != nil {
		t.Fatalf("simwork: %v\n%s", err, out)
	}
	r := s.report()
	held := map[string]uint64{} // by GPU, at the process's exit
	for _, row := range r.Rows() {
		if row.PID == uint32(w.Process.Pid) {
			held[row.GPU()] += row.AllocBytes - row.FreeBytes
		}
	}
	want := map[string]uint64{"0": 18 * MiB, "1": 30 * MiB, "2": 29 * MiB, "host": 4096 + 6*MiB, "managed": 8192}
	if !maps.Equal(held, want) {
		t.Errorf("held at exit %v, want %v", held, want)
	}
	assertNoLosses(t, r)
}

// TestRetainedHandleReleasedLast: VMM handles released as NCCL releases
// them (cuMemRetainAllocationHandle, then cuMemRelease once per reference)
// stay live until their last release, and no release is unknown.
func TestRetainedHandleReleasedLast(t *testing.T) {
	w := startWorkload(t, nil, simwork, "retain")
	s := startProfiler(t, profiler.Config{Library: simLib}, w)
	expect := w.run()
	r := s.report()
	row := rowsBySite(t, r, w.pid)[site{"cuMemCreate", "create_mapped"}]
	if row.AllocBytes != uint64(expect["created"]) || row.LiveBytes() != uint64(expect["live"]) || row.FreeCount != 1 {
		t.Errorf("handles %+v, want %v created and %v live", row.Counters, expect["created"], expect["live"])
	}
	if r.Ledger.UnknownFrees != 0 {
		t.Errorf("unknown frees %d", r.Ledger.UnknownFrees)
	}
	assertNoLosses(t, r)
	w.exit()
}

// TestProcessesStayApart: two processes running the same code get a row each.
func TestProcessesStayApart(t *testing.T) {
	a := startWorkload(t, nil, simwork, "hold", "1000")
	b := startWorkload(t, nil, simwork, "hold", "2000")
	s := startProfiler(t, profiler.Config{Library: simLib}, a, b)
	a.run()
	b.run()
	r := s.report()
	for _, w := range []struct {
		w     *workload
		bytes uint64
	}{{a, 1000}, {b, 2000}} {
		rows := rowsBySite(t, r, w.w.pid)
		if len(rows) != 1 || rows[site{"cuMemAlloc_v2", "hold"}].LiveBytes() != w.bytes {
			t.Errorf("pid %d: %+v", w.w.pid, rows)
		}
	}
	a.exit()
	b.exit()
}

// TestPythonWorkloadExact: a Python program calling the driver through
// ctypes from nested functions and four threads, under every interpreter.
func TestPythonWorkloadExact(t *testing.T) {
	for _, python := range pythons(t) {
		t.Run(pythonName(python), func(t *testing.T) {
			s, w := startPython(t, profiler.Config{Library: simLib}, python, "model")
			expect := w.run()
			r := s.report()
			c := processTotals(r, w.pid)
			want := accounting.Counters{
				AllocBytes: expect["alloc_bytes"], AllocCount: expect["allocs"],
				FreeBytes: expect["freed_bytes"], FreeCount: expect["frees"],
			}
			if c != want {
				t.Errorf("books %+v, workload counted %+v", c, want)
			}
			if r.Python.Events != want.AllocCount || r.Python.Missing != 0 {
				t.Errorf("python stats %+v for %d allocations", r.Python, want.AllocCount)
			}
			assertNoLosses(t, r)
			w.exit()
		})
	}
}

// pythons are the interpreters of ../shared/DESIGN.md present here.
func pythons(t *testing.T) []string {
	var found []string
	for _, p := range []string{
		"/root/.pyenv/versions/3.10.13/bin/python3.10",
		"/root/.pyenv/versions/3.11.7/bin/python3.11",
		"/root/.pyenv/versions/3.12.1/bin/python3.12",
		"/root/.pyenv/versions/3.13.0/bin/python3.13",
		"/usr/bin/python3.11",
	} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("interpreter missing: %s", p)
		}
		found = append(found, p)
	}
	return found
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o755); err != nil {
		t.Fatal(fmt.Errorf("copy %s: %w", from, err))
	}
}
