package tests

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/usdt"
)

// TestAgentKilledAndRestarted (issue 21, point 3; docs/faults.md): the
// agent SIGKILLed while it traces a Python process on the simulated
// PyTorch allocator. The kernel takes its uprobes away with its file
// descriptors: none of its uprobe_multi links is left (bpftool), and the
// allocator's USDT semaphores, which the kernel counted up for its
// probes, are back to zero in the traced process (read from its memory),
// so the process no longer pays for the probes. A restarted agent traces
// the same process again, exactly.
func TestAgentKilledAndRestarted(t *testing.T) {
	python := pythons(t)[2]
	dir := t.TempDir()
	// Private copies: only this test's process maps them, so that no
	// other test's tracer counts in their semaphores.
	driver := filepath.Join(dir, "driver", "libcuda.so.1")
	allocator := filepath.Join(dir, "torch", "libc10_cuda.so")
	copyFile(t, simLib, driver)
	copyFile(t, filepath.Join(repoRoot, "build/sim/libc10_cuda.so"), allocator)
	copyFile(t, filepath.Join(repoRoot, "build/sim/libc10.so"), filepath.Join(dir, "torch", "libc10.so"))
	semaphores := semaphoreOffsets(t, allocator)

	w := startWorkload(t, []string{"SIMCUDA_LIB=" + driver, "SIMTORCH_LIB=" + allocator}, python,
		filepath.Join(repoRoot, "tests/workloads/simwork.py"), "tensors")
	if got := readSemaphores(t, w.pid, allocator, semaphores); !allZero(got) {
		t.Fatalf("semaphores %v before any agent", got)
	}

	agent := func() (*cli, string) {
		// --pid: no other process's allocator (another test's, another
		// run's) is attached, nor its semaphores counted.
		c := startCLI(t, "agent", "--pid", strconv.Itoa(w.pid), "--tensor-pid", strconv.Itoa(w.pid), "--library", driver, "--metrics-address", "127.0.0.1:0", "--pyroscope-interval", "200ms")
		url := c.metricsURL()
		c.waitEvent(logs.TensorView, "pid", w.pid)
		return c, url
	}
	first, _ := agent()
	if got := readSemaphores(t, w.pid, allocator, semaphores); allZero(got) {
		t.Fatalf("semaphores %v with the agent attached", got)
	}
	links := agentLinks(t, first.cmd.Process.Pid)
	onFile := map[string]int{}
	for id, path := range links {
		onFile[path]++
		if !kernelLinks(t)[id] {
			t.Fatalf("bpftool does not list the agent's link %v", id)
		}
	}
	// The allocator's: its USDT sites', and nine on its own functions
	// (the entries and ret instructions of setCheckpointPoolState, raw_alloc
	// and raw_alloc_with_stream; the entries of raw_delete,
	// beginAllocateToPool and endAllocateToPool); and one on libc10.so's
	// reportOutOfMemoryToProfiler.
	c10 := filepath.Join(dir, "torch", "libc10.so")
	if onFile[driver] != 1 || onFile[allocator] != 10 || onFile[c10] != 1 || len(links) != 12 {
		t.Fatalf("the agent's uprobe_multi links: %v", links)
	}

	first.cmd.Process.Kill() // SIGKILL: no cleanup of its own
	first.cmd.Wait()
	waitfor.Condition(t, "the semaphores back to zero", hangLimit, func() bool { return allZero(readSemaphores(t, w.pid, allocator, semaphores)) })
	waitfor.Condition(t, "the agent's links gone", hangLimit, func() bool {
		now := kernelLinks(t)
		for id := range links {
			if now[id] {
				return false
			}
		}
		return true
	})

	second, url := agent()
	if got := readSemaphores(t, w.pid, allocator, semaphores); allZero(got) {
		t.Fatalf("semaphores %v with the agent restarted", got)
	}
	expect := w.run()
	var want float64
	for k, v := range expect {
		if strings.HasPrefix(k, "tensor_") {
			want += float64(v)
		}
	}
	if want == 0 {
		t.Fatalf("workload: %v", expect)
	}
	tensorLive := func(f map[string]*dto.MetricFamily) float64 {
		var sum float64
		for _, m := range f["gpumem_tensor_live_bytes"].GetMetric() {
			if metricstest.Labels(m)["pid"] == strconv.Itoa(w.pid) {
				sum += m.GetGauge().GetValue()
			}
		}
		return sum
	}
	f := metricstest.ScrapeUntil(t, url, hangLimit, func(f map[string]*dto.MetricFamily) bool { return tensorLive(f) == want })
	if got := tensorLive(f); got != want {
		t.Errorf("the restarted agent counts %v live tensor bytes, want %v", got, want)
	}
	second.interrupt()
	// As after the kill: the kernel may count a semaphore down a moment
	// after the process that held the link is gone (seen once in five runs
	// beside another suite).
	waitfor.Condition(t, "the semaphores back to zero after the agent stopped", hangLimit, func() bool {
		return allZero(readSemaphores(t, w.pid, allocator, semaphores))
	})
	w.exit()
}

// semaphoreOffsets are the file offsets of the USDT semaphores of the
// library at path.
func semaphoreOffsets(t *testing.T, path string) []uint64 {
	t.Helper()
	probes, err := usdt.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	var offsets []uint64
	for _, p := range probes {
		if p.SemaphoreOffset != 0 && !seen[p.SemaphoreOffset] {
			seen[p.SemaphoreOffset] = true
			offsets = append(offsets, p.SemaphoreOffset)
		}
	}
	if len(offsets) == 0 {
		t.Fatalf("%s: no USDT semaphore", path)
	}
	return offsets
}

// readSemaphores reads the semaphores (16-bit counters) at the file
// offsets of the library at path, from the memory of process pid.
func readSemaphores(t *testing.T, pid int, path string, offsets []uint64) []uint16 {
	t.Helper()
	maps, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mem")
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	var values []uint16
	for _, off := range offsets {
		found := false
		for _, line := range strings.Split(string(maps), "\n") {
			f := strings.Fields(line)
			if len(f) < 6 || f[5] != path {
				continue
			}
			lo, hi, _ := strings.Cut(f[0], "-")
			start, _ := strconv.ParseUint(lo, 16, 64)
			end, _ := strconv.ParseUint(hi, 16, 64)
			fileOff, _ := strconv.ParseUint(f[2], 16, 64)
			if off < fileOff || off >= fileOff+(end-start) {
				continue
			}
			var b [2]byte
			if _, err := mem.ReadAt(b[:], int64(start+off-fileOff)); err != nil {
				t.Fatal(err)
			}
			values = append(values, binary.LittleEndian.Uint16(b[:]))
			found = true
			break
		}
		if !found {
			t.Fatalf("semaphore at file offset %#x of %s not mapped in %d", off, path, pid)
		}
	}
	return values
}

func allZero(values []uint16) bool {
	for _, v := range values {
		if v != 0 {
			return false
		}
	}
	return true
}

// agentLinks are the uprobe_multi links a process holds, by link ID:
// the file each is on, read from the fdinfo of its file descriptors.
// (Debian's bpftool prints these links as "type 12", without their file.)
func agentLinks(t *testing.T, pid int) map[float64]string {
	t.Helper()
	fds, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/fdinfo/*")
	if err != nil {
		t.Fatal(err)
	}
	links := map[float64]string{}
	for _, fd := range fds {
		data, err := os.ReadFile(fd)
		if err != nil {
			continue // closed since
		}
		fields := map[string]string{}
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				fields[k] = strings.TrimSpace(v)
			}
		}
		if fields["link_type"] == "uprobe_multi" {
			id, _ := strconv.Atoi(fields["link_id"])
			links[float64(id)] = fields["path"]
		}
	}
	return links
}

// kernelLinks are the IDs of every BPF link the kernel holds, as bpftool
// lists them.
func kernelLinks(t *testing.T) map[float64]bool {
	t.Helper()
	out, err := exec.Command("bpftool", "-j", "link", "list").Output()
	if err != nil {
		t.Fatalf("bpftool link list: %v", err)
	}
	var links []struct {
		ID float64 `json:"id"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		t.Fatalf("bpftool link list: %v", err)
	}
	ids := map[float64]bool{}
	for _, l := range links {
		ids[l.ID] = true
	}
	return ids
}
