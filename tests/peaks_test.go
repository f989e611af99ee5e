package tests

import (
	"maps"
	"testing"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// TestPeaksBetweenReads: on GPU 1, a spike that rises and falls between two
// reads of the interval's peaks is caught exactly, total and per stack,
// beside GPU 0's memory held all along; a higher spike from another
// function later replaces it, in its own interval and in the run's peak,
// which outlives the process's exit.
func TestPeaksBetweenReads(t *testing.T) {
	w := startWorkload(t, []string{"SIMCUDA_DEVICES=2"}, simwork, "spike")
	s := startProfiler(t, profiler.Config{Library: simLib}, w)

	first := w.run()
	firstPeaks := s.intervalPeaks(w.pid)
	checkPeak(t, "first interval, GPU 1", firstPeaks["1"], first["gpu1_peak"],
		map[string]uint64{"spike_base": first["gpu1_base"], "first_spike": first["first_spike"]})
	checkPeak(t, "first interval, GPU 0", firstPeaks["0"], first["gpu0_base"], map[string]uint64{"spike_base": first["gpu0_base"]})
	// What a report shows at the end of the interval misses the spike.
	if live := rowsBySite(t, s.report(), w.pid)[site{"cuMemAlloc_v2", "first_spike"}].LiveBytes(); live != 0 {
		t.Errorf("first_spike holds %d bytes at the end of the interval", live)
	}

	second := w.run()
	peaks := s.intervalPeaks(w.pid)
	higher := map[string]uint64{"spike_base": second["gpu1_base"], "higher_spike": second["higher_spike"]}
	checkPeak(t, "second interval, GPU 1", peaks["1"], second["gpu1_peak"], higher)
	// GPU 0 held its memory all along: the interval's start, after the
	// first interval's spike.
	checkPeak(t, "second interval, GPU 0", peaks["0"], second["gpu0_base"], map[string]uint64{"spike_base": second["gpu0_base"]})
	if peaks["0"].Timestamp <= firstPeaks["1"].Timestamp {
		t.Errorf("GPU 0's peak of the second interval at %d, before the first spike at %d", peaks["0"].Timestamp, firstPeaks["1"].Timestamp)
	}

	w.exit()
	r := s.report()
	if processTotals(r, w.pid).LiveBytes() != 0 || r.Ledger.ProcessExits != 1 {
		t.Fatalf("exit not accounted: %+v", r.Ledger)
	}
	run := peaksOf(t, r.Peaks, w.pid)
	checkPeak(t, "run, GPU 1", run["1"], second["gpu1_peak"], higher)
	checkPeak(t, "run, GPU 0", run["0"], second["gpu0_base"], map[string]uint64{"spike_base": second["gpu0_base"]})
	if len(run) != 2 {
		t.Errorf("run peaks on %d GPUs, want 2", len(run))
	}
	assertNoLosses(t, r)
}

// takeInterval ends the interval once every event sent so far is
// accounted, and returns its snapshot.
func (s *session) takeInterval() *snapshot.Snapshot {
	s.t.Helper()
	if err := s.p.Sync(); err != nil {
		s.t.Fatal(err)
	}
	snap := &snapshot.Snapshot{}
	if err := s.p.EndInterval(snap); err != nil {
		s.t.Fatal(err)
	}
	return snap
}

// intervalPeaks reads the interval's peaks of process pid once every event
// sent so far is accounted, by GPU.
func (s *session) intervalPeaks(pid int) map[string]snapshot.Peak {
	s.t.Helper()
	snap := s.takeInterval()
	peaks := peaksOf(s.t, snap.Peaks, pid)
	named := map[accounting.Key]snapshot.Row{}
	for _, row := range snap.Rows() {
		named[row.Key] = row
	}
	for gpu, pk := range peaks {
		pk.Rows = namedShares(s.t, pk, named)
		peaks[gpu] = pk
	}
	return peaks
}

// namedShares are an interval's peak's shares as rows with frames, from
// the rows of its snapshot, as the exporter finds them.
func namedShares(t *testing.T, pk snapshot.Peak, named map[accounting.Key]snapshot.Row) []snapshot.Row {
	t.Helper()
	rows := make([]snapshot.Row, 0, len(pk.Shares))
	for _, s := range pk.Shares {
		row, ok := named[s.Key]
		if !ok {
			t.Fatalf("share %+v of no row", s)
		}
		row.Counters = accounting.Counters{AllocBytes: s.Bytes, AllocCount: s.Count}
		rows = append(rows, row)
	}
	return rows
}

// peaksOf are the driver view's peaks of process pid, by GPU; it has no
// tensors.
func peaksOf(t *testing.T, peaks []snapshot.Peak, pid int) map[string]snapshot.Peak {
	t.Helper()
	byGPU := map[string]snapshot.Peak{}
	for _, pk := range peaks {
		if pk.PID != uint32(pid) {
			continue
		}
		if pk.View != memory.ViewDriver {
			t.Errorf("peak in the %s view: %+v", pk.View, pk)
		}
		byGPU[pk.GPU] = pk
	}
	return byGPU
}

// checkPeak compares a peak's total and each function's share of it, the
// function that called the driver.
func checkPeak(t *testing.T, what string, pk snapshot.Peak, bytes uint64, shares map[string]uint64) {
	t.Helper()
	got := map[string]uint64{}
	var sum uint64
	for _, r := range pk.Rows {
		if len(r.Frames) < 2 || r.Frames[0].Function != "cuMemAlloc_v2" {
			t.Fatalf("%s: stack %v", what, frameNames(r.Frames))
		}
		got[r.Frames[1].Function] += r.LiveBytes()
		sum += r.LiveBytes()
	}
	if pk.Bytes != bytes || sum != bytes || !maps.Equal(got, shares) {
		t.Errorf("%s: %d bytes (rows %d): %v; want %d: %v", what, pk.Bytes, sum, got, bytes, shares)
	}
}
