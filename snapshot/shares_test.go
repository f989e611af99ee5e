package snapshot

import (
	"slices"
	"testing"

	"github.com/gpu-mem/gpu-mem/accounting"
)

// TestKeepSharesReusesTheSnapshotsMemory: shares kept are a copy, not
// changed when their maker reuses its memory, nor by growing another
// peak's; the next snapshot taken into the same Snapshot reuses their
// memory, and a reset leaves no row or library.
func TestKeepSharesReusesTheSnapshotsMemory(t *testing.T) {
	row := func(pid uint32, bytes uint64) accounting.PeakRow {
		return accounting.PeakRow{Key: accounting.Key{PID: pid}, Amount: accounting.Amount{Bytes: bytes}}
	}
	var s Snapshot
	maker := []accounting.PeakRow{row(7, 10), row(8, 20)}
	first := s.KeepShares(maker)
	maker[0].Bytes = 99 // the maker's memory, reused
	if want := []accounting.PeakRow{row(7, 10), row(8, 20)}; !slices.Equal(first, want) {
		t.Fatalf("kept %v, want %v", first, want)
	}
	s.Entries, s.Libraries = append(s.Entries, Entry{}), append(s.Libraries, "libcuda.so.1")
	s.Reset()
	a, b := s.KeepShares(maker[:1]), s.KeepShares(maker[1:])
	_ = append(a, row(9, 1)) // a peak grown (NVML's part): not over the next one's
	if &a[0] != &first[0] || !slices.Equal(a, []accounting.PeakRow{row(7, 99)}) || !slices.Equal(b, []accounting.PeakRow{row(8, 20)}) {
		t.Errorf("after a reset: %v at %p and %v, want [7: 99] at the first's %p and [8: 20]", a, &a[0], b, &first[0])
	}
	if len(s.Entries) != 0 || cap(s.Entries) != 1 || len(s.Libraries) != 0 {
		t.Errorf("after a reset: %d entries (room for %d), %d libraries; want none, room for 1", len(s.Entries), cap(s.Entries), len(s.Libraries))
	}
}
