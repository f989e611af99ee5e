package accounting

import (
	"testing"

	"github.com/gpu-mem/gpu-mem/memory"
)

// BenchmarkAllocFree is the books' cost per allocation + free pair, in
// three patterns, with peaks tracked. Peak tracking cannot be turned off:
// its cost is this benchmark run on the ledger before peaks, the same code
// and loop (the numbers: see the commit that added peaks). It uses no API
// that ledger lacked.
func BenchmarkAllocFree(b *testing.B) {
	// Steady: 1000 allocations of 100 stacks stay live, one more comes and
	// goes; the peak was reached once.
	b.Run("steady", func(b *testing.B) {
		l := newBenchLedger(1000)
		var ts uint64 = 1 << 20
		for b.Loop() {
			ts += 2
			l.Alloc(benchKey(int(ts)), 1<<30, memory.SpacePointer, 4096, ts)
			l.Free(1, cuMemFree, 1<<30, ts+1)
		}
	})
	// Rising: each allocation is a new high, and its free the first
	// decrease after it: the peak's rows are updated at every free.
	b.Run("rising", func(b *testing.B) {
		l := newBenchLedger(1000)
		var ts uint64 = 1 << 20
		for b.Loop() {
			ts += 2
			l.Alloc(benchKey(int(ts)), 1<<30, memory.SpacePointer, ts, ts)
			l.Free(1, cuMemFree, 1<<30, ts+1)
		}
	})
	// Waves: 1000 allocations from 1000 stacks, each a byte larger than in
	// the wave before, then all freed: each wave's first free updates the
	// 1000 rows of its peak, the worst case of one update. One op is a
	// wave; ns/pair is per allocation + free.
	b.Run("waves", func(b *testing.B) {
		const wave = 1000
		l := New()
		var ts, height uint64
		for b.Loop() {
			height++
			for i := range uint64(wave) {
				ts++
				l.Alloc(Key{PID: 1, Stack: StackID(i), Kind: memory.KindDevice}, i, memory.SpacePointer, 4096+height, ts)
			}
			for i := range uint64(wave) {
				ts++
				l.Free(1, cuMemFree, i, ts)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/wave, "ns/pair")
	})
}

// newBenchLedger holds n allocations of one process from 100 stacks.
func newBenchLedger(n int) *Ledger {
	l := New()
	for i := range n {
		l.Alloc(benchKey(i), uint64(i), memory.SpacePointer, 4096, uint64(i+1))
	}
	return l
}

func benchKey(i int) Key { return Key{PID: 1, Stack: StackID(i % 100), Kind: memory.KindDevice} }
