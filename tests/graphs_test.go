package tests

import (
	"fmt"
	"testing"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/profiler"
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
