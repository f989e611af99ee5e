package tests

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/report"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// TestCUDAGraphTree: CUDA graph trees as Inductor runs them (torch.compile's
// reduce-overhead) on the simulated allocator's private pool. Checkpoint
// restores free blocks and make others live again inside the allocator,
// passing no USDT site, and the dead tensors' blocks are freed with
// raw_delete, and a block of caching_allocator_alloc (raw_alloc) is held
// midway: no USDT site either. The tensor view still equals the allocator's requested bytes,
// current and peak, midway and at the end. Its peak is a restore's: the
// pool's whole segment made live at once, as torch counts it.
func TestCUDAGraphTree(t *testing.T) {
	python := pythons(t)[2]
	s, w := startTensors(t, profiler.Config{Library: simLib}, python, "graph_tree")
	fmt.Fprintln(w.stdin)
	live := w.values("live")
	checkTensorBooks(t, "midway", s.report(), w.pid, live)
	expect := w.run()
	r := s.report()
	checkTensorBooks(t, "at the end", r, w.pid, expect)
	if expect["tensor_peak"] != expect["peak_in_restore"] {
		t.Errorf("the allocator's peak %d, want the restore's %d", expect["tensor_peak"], expect["peak_in_restore"])
	}
	tensors := byPythonFunction(r, w.pid, memory.KindTensor)
	if row := tensors["graph_weights"]; row.LiveBytes() != expect["tensor_live"] {
		t.Errorf("graph_weights hold %d, want all that is live, %d", row.LiveBytes(), expect["tensor_live"])
	}
	// The blocks a restore made live are charged to it; raw_alloc's to
	// its caller.
	if row := tensors["apply_checkpoint"]; row.AllocCount == 0 || row.LiveBytes() != 0 {
		t.Errorf("apply_checkpoint: %+v", row.Counters)
	}
	if row := tensors["caching_allocator_alloc"]; row.AllocBytes != 787_435 || row.FreeBytes != 787_435 || row.AllocCount != 2 {
		t.Errorf("caching_allocator_alloc: %+v", row.Counters)
	}
	if r.Ledger.UnknownFrees != 0 {
		t.Errorf("unknown frees: %v", r.Ledger.UnknownFreesBy)
	}
	assertNoLosses(t, r)
	w.exit()
}

// TestCUDAGraphPool: the segments a CUDA graph's private pool holds (the
// simulated allocator's, made between beginAllocateToPool and
// endAllocateToPool) are charged to the stacks that captured the graph
// (warmup_run, record_graph) as the graph pool's part of the driver view,
// equal to the pool's reserved bytes; what the warm-up got from the driver
// itself (a library's workspace) is not the pool's; the allocator cache is the other
// segments less the tensors outside the pool; releasing the pool and
// emptying the cache ends the pool's segments (their driver frees).
func TestCUDAGraphPool(t *testing.T) {
	python := pythons(t)[2]
	s, w := startTensors(t, profiler.Config{Library: simLib}, python, "graph_tree")
	fmt.Fprintln(w.stdin)
	live := w.values("live")
	if live["pool_reserved"] == 0 || live["pool_requested"] == 0 {
		t.Fatalf("the workload's pool holds nothing midway: %v", live)
	}
	r := s.report()
	checkGraphPool(t, "midway", r, w.pid, live)
	capturedBy := map[string]uint64{}
	for _, row := range r.Rows() {
		if row.PID == uint32(w.pid) && row.Kind.View() == memory.ViewDriver && report.GraphPoolRow(row.Frames) {
			if py := pythonFrames(row.Frames); len(py) > 0 {
				capturedBy[py[0].Function] += row.LiveBytes()
			}
		}
	}
	if capturedBy["warmup_run"]+capturedBy["record_graph"] != live["pool_reserved"] || len(capturedBy) != 2 {
		t.Errorf("the pool's segments are charged to %v, want warmup_run and record_graph, %d in all", capturedBy, live["pool_reserved"])
	}
	var workspace uint64
	for _, row := range r.Rows() {
		py := pythonFrames(row.Frames)
		if row.PID == uint32(w.pid) && row.Kind == memory.KindDevice && len(py) > 1 && py[1].Function == "warmup_run" &&
			!report.GraphPoolRow(row.Frames) {
			workspace += row.LiveBytes()
		}
	}
	if workspace != 3<<20 {
		t.Errorf("the library's workspace made during the warm-up: %d bytes outside the pool, want %d", workspace, 3<<20)
	}
	expect := w.run()
	r = s.report()
	checkGraphPool(t, "at the end", r, w.pid, expect)
	var made, freed uint64
	for _, row := range r.Rows() {
		if row.PID == uint32(w.pid) && row.Kind.View() == memory.ViewDriver && report.GraphPoolRow(row.Frames) {
			made, freed = made+row.AllocBytes, freed+row.FreeBytes
		}
	}
	if made != live["pool_reserved"] || freed != made {
		t.Errorf("the pool's segments: %d made, %d freed; want the %d midway, all freed", made, freed, live["pool_reserved"])
	}
	assertNoLosses(t, r)
	w.exit()
}

// checkGraphPool compares process pid's parts of GPU 0 with the allocator's
// books: the graph pool's segments and tensors, the other segments, the
// cache.
func checkGraphPool(t *testing.T, when string, r *snapshot.Snapshot, pid int, books map[string]uint64) {
	t.Helper()
	for _, p := range report.ByProcessGPU(r.Rows()) {
		if p.PID != uint32(pid) || p.GPU != "0" {
			continue
		}
		cache, ok := p.Cache()
		want := books["reserved"] - books["pool_reserved"] - (books["tensor_live"] - books["pool_requested"])
		if p.GraphPool != books["pool_reserved"] || p.GraphPoolTensors != books["pool_requested"] ||
			p.Segments != books["reserved"]-books["pool_reserved"] || !ok || cache != want {
			t.Errorf("%s: graph pool %d (tensors %d), segments %d, cache %d (%v); the allocator's pool %d (tensors %d), other segments %d, cache %d",
				when, p.GraphPool, p.GraphPoolTensors, p.Segments, cache, ok,
				books["pool_reserved"], books["pool_requested"], books["reserved"]-books["pool_reserved"], want)
		}
		return
	}
	t.Errorf("%s: no memory of pid %d on GPU 0", when, pid)
}

// checkTensorBooks compares process pid's tensor view in r, its live bytes
// and its peak, with the allocator's own books (tensor_live, tensor_peak).
func checkTensorBooks(t *testing.T, when string, r *snapshot.Snapshot, pid int, books map[string]uint64) {
	t.Helper()
	var live uint64
	for _, row := range r.Rows() {
		if row.PID == uint32(pid) && row.Kind == memory.KindTensor {
			live += row.LiveBytes()
		}
	}
	if live != books["tensor_live"] {
		t.Errorf("%s: tensor view holds %d, the allocator's requested bytes are %d", when, live, books["tensor_live"])
	}
	var peak uint64
	for _, pk := range r.Peaks {
		if pk.PID == uint32(pid) && pk.View == memory.ViewTensor && pk.GPU == "0" {
			peak = pk.Bytes
		}
	}
	if peak != books["tensor_peak"] {
		t.Errorf("%s: tensor view's peak %d, the allocator's %d", when, peak, books["tensor_peak"])
	}
}

// TestCUDAGraphTreeOutputs: the same through gpumem record's outputs that
// show the tensor view: the JSON report (its tensor stacks' live bytes and
// its tensor peak) of a recording stopped midway and of one at the end, and
// the folded files of the tensor view (live bytes, the peak's stacks) at
// the end.
func TestCUDAGraphTreeOutputs(t *testing.T) {
	python := pythons(t)[2]
	dir := t.TempDir()
	w := startWorkload(t, []string{"SIMCUDA_LIB=" + simLib, "SIMTORCH_LIB=" + filepath.Join(repoRoot, "build/sim/libc10_cuda.so")},
		python, filepath.Join(repoRoot, "tests/workloads/simwork.py"), "graph_tree")
	record := func(name string, args ...string) *cli {
		c := startCLI(t, append([]string{"record", "--pid", strconv.Itoa(w.pid), "--library", simLib, "--top", "0",
			"-o", filepath.Join(dir, name)}, args...)...)
		c.waitStderr("PyTorch allocator probes, setCheckpointPoolState, raw_alloc, raw_delete, beginAllocateToPool and endAllocateToPool")
		c.waitEvent(logs.Python, "pid", w.pid)
		return c
	}
	outputs := map[string][]string{
		"midway.json":     {"--format", "json"},
		"end.json":        {"--format", "json"},
		"end.live.folded": {"--format", "folded", "--view", "tensor"},
		"end.peak.folded": {"--format", "folded", "--view", "tensor", "--value", "peak"},
	}
	clis := map[string]*cli{}
	for name, args := range outputs {
		clis[name] = record(name, args...)
	}
	check := func(when string, books map[string]uint64) {
		t.Helper()
		for name, c := range clis {
			if strings.HasPrefix(name, when+".") {
				c.interrupt()
			}
		}
		var r struct {
			Stacks []struct {
				PID       uint32 `json:"pid"`
				Kind      string `json:"kind"`
				LiveBytes uint64 `json:"live_bytes"`
			}
			Peaks []struct {
				PID   uint32 `json:"pid"`
				View  string `json:"view"`
				Bytes uint64 `json:"bytes"`
			}
		}
		readJSON(t, filepath.Join(dir, when+".json"), &r)
		var live, peak uint64
		for _, s := range r.Stacks {
			if s.PID == uint32(w.pid) && s.Kind == "tensor" {
				live += s.LiveBytes
			}
		}
		for _, p := range r.Peaks {
			if p.PID == uint32(w.pid) && p.View == "tensor" {
				peak = p.Bytes
			}
		}
		if live != books["tensor_live"] || peak != books["tensor_peak"] {
			t.Errorf("%s: JSON: tensor view holds %d, peak %d; the allocator's requested bytes %d, peak %d",
				when, live, peak, books["tensor_live"], books["tensor_peak"])
		}
		for name, want := range map[string]uint64{"live.folded": books["tensor_live"], "peak.folded": books["tensor_peak"]} {
			if path := filepath.Join(dir, when+"."+name); clis[when+"."+name] != nil && foldedTotal(t, path) != want {
				t.Errorf("%s: %s sums to %d, want %d", when, name, foldedTotal(t, path), want)
			}
		}
	}
	fmt.Fprintln(w.stdin)
	check("midway", w.values("live"))
	check("end", w.run())
	w.exit()
}
