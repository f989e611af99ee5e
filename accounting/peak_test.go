package accounting

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/gpu-mem/gpu-mem/memory"
)

// peakWant is a peak as the tests write it: the total, when, and each row's
// share.
type peakWant struct {
	total Amount
	time  uint64
	rows  map[Key]Amount
}

func driverOn(gpu string) PeakKey { return PeakKey{PID: 10, View: memory.ViewDriver, GPU: gpu} }
func tensorOn(gpu string) PeakKey { return PeakKey{PID: 10, View: memory.ViewTensor, GPU: gpu} }

func checkPeaks(t *testing.T, what string, got []Peak, want map[PeakKey]peakWant) {
	t.Helper()
	seen := map[PeakKey]bool{}
	for _, p := range got {
		if seen[p.PeakKey] {
			t.Errorf("%s: %+v twice", what, p.PeakKey)
		}
		seen[p.PeakKey] = true
		w, ok := want[p.PeakKey]
		if !ok {
			t.Errorf("%s: unexpected peak %+v", what, p)
			continue
		}
		rows := map[Key]Amount{}
		var sum Amount
		for _, r := range p.Rows {
			rows[r.Key] = r.Amount
			sum.Bytes += r.Bytes
			sum.Count += r.Count
		}
		if p.Amount != w.total || p.Time != w.time || !maps.Equal(rows, w.rows) {
			t.Errorf("%s: %+v: %+v at %d, rows %v; want %+v at %d, rows %v", what, p.PeakKey, p.Amount, p.Time, rows, w.total, w.time, w.rows)
		}
		if sum != p.Amount {
			t.Errorf("%s: %+v: rows sum to %+v, total %+v", what, p.PeakKey, sum, p.Amount)
		}
	}
	for k := range want {
		if !seen[k] {
			t.Errorf("%s: no peak for %+v", what, k)
		}
	}
}

var (
	gpu0Weights = Key{PID: 10, Stack: 1, Kind: memory.KindDevice, Device: 0}
	gpu1Weights = Key{PID: 10, Stack: 1, Kind: memory.KindDevice, Device: 1}
	gpu1Spike   = Key{PID: 10, Stack: 2, Kind: memory.KindDevice, Device: 1}
	gpu1Tensors = Key{PID: 10, Stack: 3, Kind: memory.KindTensor, Device: 1}
	gpu1Higher  = Key{PID: 10, Stack: 4, Kind: memory.KindDevice, Device: 1}
)

// TestSpikesBetweenReads: spikes that rise and fall between two reads are
// caught exactly, total and per stack, each GPU and view apart; then a
// higher spike later replaces the first, in the run's peak and in its own
// interval's.
func TestSpikesBetweenReads(t *testing.T) {
	l := New()
	l.Alloc(gpu0Weights, 0x100, memory.SpacePointer, 100, 1)
	l.Alloc(gpu1Weights, 0x200, memory.SpacePointer, 50, 2)
	l.Alloc(gpu1Spike, 0x300, memory.SpacePointer, 200, 3)
	l.Alloc(gpu1Spike, 0x400, memory.SpacePointer, 300, 4)
	l.Free(10, cuMemFree, 0x300, 5)
	l.Free(10, cuMemFree, 0x400, 6)
	// A tensor inside device memory: the tensor view's peak, not added to
	// the driver view's.
	l.Alloc(gpu1Tensors, 0x200, memory.SpaceTensor, 40, 7)
	l.Free(10, pytorchFree, 0x200, 8)

	first := map[PeakKey]peakWant{
		driverOn("0"): {Amount{100, 1}, 1, map[Key]Amount{gpu0Weights: {100, 1}}},
		driverOn("1"): {Amount{550, 3}, 4, map[Key]Amount{gpu1Weights: {50, 1}, gpu1Spike: {500, 2}}},
		tensorOn("1"): {Amount{40, 1}, 7, map[Key]Amount{gpu1Tensors: {40, 1}}},
	}
	checkPeaks(t, "first interval", l.TakeIntervalPeaks(10), first)
	checkPeaks(t, "run after the first interval", l.Peaks(), first)

	// A lower spike, then a higher one from another stack, then the lower
	// one again: the higher replaces the first interval's.
	l.Alloc(gpu1Spike, 0x300, memory.SpacePointer, 400, 11)
	l.Free(10, cuMemFree, 0x300, 12)
	l.Alloc(gpu1Higher, 0x500, memory.SpacePointer, 600, 13)
	l.Free(10, cuMemFree, 0x500, 14)
	l.Alloc(gpu1Spike, 0x300, memory.SpacePointer, 100, 15)
	l.Free(10, cuMemFree, 0x300, 16)

	second := map[PeakKey]peakWant{
		// Held all along: the level the interval began with, at its start.
		driverOn("0"): {Amount{100, 1}, 10, map[Key]Amount{gpu0Weights: {100, 1}}},
		driverOn("1"): {Amount{650, 2}, 13, map[Key]Amount{gpu1Weights: {50, 1}, gpu1Higher: {600, 1}}},
		// The tensor view held nothing: no peak.
	}
	checkPeaks(t, "second interval", l.TakeIntervalPeaks(20), second)
	checkPeaks(t, "run", l.Peaks(), map[PeakKey]peakWant{
		driverOn("0"): first[driverOn("0")],
		driverOn("1"): second[driverOn("1")],
		tensorOn("1"): first[tensorOn("1")],
	})
}

// TestIntervalPeakNeverBelowItsStart: memory held when an interval begins
// and freed during it is that interval's peak, at its start.
func TestIntervalPeakNeverBelowItsStart(t *testing.T) {
	l := New()
	l.Alloc(gpu0Weights, 0x100, memory.SpacePointer, 100, 1)
	l.Alloc(gpu0Weights, 0x200, memory.SpacePointer, 30, 2)
	l.TakeIntervalPeaks(5)
	l.Free(10, cuMemFree, 0x100, 6)
	l.Alloc(gpu0Weights, 0x300, memory.SpacePointer, 90, 7) // 120: below the start
	want := map[PeakKey]peakWant{driverOn("0"): {Amount{130, 2}, 5, map[Key]Amount{gpu0Weights: {130, 2}}}}
	checkPeaks(t, "interval", l.TakeIntervalPeaks(8), want)
	// The next interval starts at 120, and a rise to it is no higher.
	l.Free(10, cuMemFree, 0x300, 9)
	l.Alloc(gpu0Weights, 0x300, memory.SpacePointer, 90, 10)
	want = map[PeakKey]peakWant{driverOn("0"): {Amount{120, 2}, 8, map[Key]Amount{gpu0Weights: {120, 2}}}}
	checkPeaks(t, "next interval", l.TakeIntervalPeaks(11), want)
}

// TestPeakOutlivesExit: a process's exit releases everything after its
// peak, which stays, in the run and in the interval it exited in, until
// the process is dropped.
func TestPeakOutlivesExit(t *testing.T) {
	l := New()
	l.Alloc(gpu0Weights, 0x100, memory.SpacePointer, 100, 1)
	l.Alloc(gpu1Spike, 0x200, memory.SpacePointer, 200, 2)
	l.Alloc(gpu1Spike, 0x300, memory.SpacePointer, 300, 3) // a growth: not copied yet
	l.Exit(10, 4)
	want := map[PeakKey]peakWant{
		driverOn("0"): {Amount{100, 1}, 1, map[Key]Amount{gpu0Weights: {100, 1}}},
		driverOn("1"): {Amount{500, 2}, 3, map[Key]Amount{gpu1Spike: {500, 2}}},
	}
	checkPeaks(t, "interval", l.TakeIntervalPeaks(4), want)
	checkPeaks(t, "run", l.Peaks(), want)
	checkPeaks(t, "interval after the exit", l.TakeIntervalPeaks(5), nil)
	l.DropExited(func(uint32) bool { return false })
	checkPeaks(t, "run after dropping", l.Peaks(), nil)
	if len(l.groups) != 0 {
		t.Errorf("groups left: %v", l.groups)
	}
}

// TestPeakWithFreeRacingReuse: a free racing with a reuse of its pointer
// on another thread comes after the reuse; the driver freed the old
// allocation before handing its pointer out again, so the two never
// counted together; the late free, and an exit before it, change nothing
// more.
func TestPeakWithFreeRacingReuse(t *testing.T) {
	for _, late := range []string{"free", "exit"} {
		t.Run(late, func(t *testing.T) {
			l := New()
			l.Alloc(weights, 0x1000, memory.SpacePointer, 100, 1)
			l.Alloc(cache, 0x1000, memory.SpacePointer, 300, 5) // returned at 5
			if late == "free" {
				l.Free(10, cuMemFree, 0x1000, 4) // entered at 4
			}
			l.Alloc(cache, 0x2000, memory.SpacePointer, 10, 6)
			l.Exit(10, 7)
			checkPeaks(t, "run", l.Peaks(), map[PeakKey]peakWant{
				{PID: 10, GPU: "0"}: {Amount{310, 2}, 6, map[Key]Amount{cache: {310, 2}}},
			})
			if held := l.groups[PeakKey{PID: 10, GPU: "0"}].live; held != (Amount{}) {
				t.Errorf("after the exit %+v held", held)
			}
		})
	}
}

// TestPeakWithRetainedHandleAndUnknownFrees: a VMM handle released once of
// twice still holds its memory; frees of pointers never seen change
// nothing.
func TestPeakWithRetainedHandleAndUnknownFrees(t *testing.T) {
	l := New()
	vmm := Key{PID: 10, Stack: 5, Kind: memory.KindVMM}
	l.Alloc(vmm, 0x10, memory.SpaceHandle, 4096, 1)
	l.Retain(10, 0x10)
	l.Free(10, cuMemRelease, 0x10, 2)
	l.Free(10, cuMemFree, 0x999, 3)
	l.Free(10, cuMemFree, 0x100, 4) // before its allocation, below: unknown
	l.Alloc(weights, 0x100, memory.SpacePointer, 100, 5)
	l.Free(10, cuMemRelease, 0x10, 6)
	l.Free(10, cuMemFree, 0x100, 7)
	checkPeaks(t, "run", l.Peaks(), map[PeakKey]peakWant{
		{PID: 10, GPU: "0"}: {Amount{4196, 2}, 5, map[Key]Amount{vmm: {4096, 1}, weights: {100, 1}}},
	})
	if s := l.Stats(); s.UnknownFrees != 2 {
		t.Errorf("unknown frees %d, want 2", s.UnknownFrees)
	}
}

// TestPeakPlaces: a process's peaks per GPU as rows label them: host
// memory (page-locked, and VMM memory on the host) apart from managed
// memory and from each device.
func TestPeakPlaces(t *testing.T) {
	l := New()
	pinned := Key{PID: 10, Stack: 1, Kind: memory.KindHost, Device: memory.DeviceUnknown}
	hostVMM := Key{PID: 10, Stack: 2, Kind: memory.KindVMM, Device: memory.DeviceHost}
	managed := Key{PID: 10, Stack: 3, Kind: memory.KindManaged, Device: memory.DeviceUnknown}
	l.Alloc(pinned, 0x1, memory.SpacePointer, 1, 1)
	l.Alloc(hostVMM, 0x2, memory.SpaceHandle, 2, 2)
	l.Alloc(managed, 0x3, memory.SpacePointer, 4, 3)
	l.Alloc(gpu1Weights, 0x4, memory.SpacePointer, 8, 4)
	checkPeaks(t, "run", l.Peaks(), map[PeakKey]peakWant{
		driverOn("host"):    {Amount{3, 2}, 2, map[Key]Amount{pinned: {1, 1}, hostVMM: {2, 1}}},
		driverOn("managed"): {Amount{4, 1}, 3, map[Key]Amount{managed: {4, 1}}},
		driverOn("1"):       {Amount{8, 1}, 4, map[Key]Amount{gpu1Weights: {8, 1}}},
	})
}

// TestPeakCopiesOnWrite: a growth copies no row; the first decrease seals
// the peak, each row keeping its share at its first change after that, and
// only then.
func TestPeakCopiesOnWrite(t *testing.T) {
	l := New()
	const n = 1000
	for i := range n {
		l.Alloc(Key{PID: 10, Stack: StackID(i)}, uint64(i), memory.SpacePointer, 1, uint64(i))
	}
	g := l.groups[PeakKey{PID: 10, GPU: "0"}]
	kept := func() (rows []StackID) {
		if s := g.trackers[run].seal; s != nil {
			for _, sh := range s.shares {
				rows = append(rows, sh.row.stack)
			}
		}
		return rows
	}
	if k := kept(); len(k) != 0 || !g.trackers[run].open {
		t.Fatalf("after a growth: rows %v kept, open %v", k, g.trackers[run].open)
	}
	l.Free(10, cuMemFree, 0, n) // seals the peak: row 0 keeps its share
	l.Alloc(Key{PID: 10, Stack: 0}, 0, memory.SpacePointer, 1, n+1)
	l.Free(10, cuMemFree, 0, n+2) // kept already
	l.Free(10, cuMemFree, 1, n+3)
	if k := kept(); !slices.Equal(k, []StackID{0, 1}) || g.trackers[run].open {
		t.Fatalf("after frees: rows %v kept, open %v", k, g.trackers[run].open)
	}
	if p := l.Peaks(); len(p) != 1 || p[0].Amount != (Amount{n, n}) || p[0].Time != n-1 || len(p[0].Rows) != n {
		t.Errorf("peak %+v", p)
	}
	// A new high by one row: open again, no copy; the shares kept are let
	// go with the seal, which no tracker is at any more.
	l.Alloc(Key{PID: 10, Stack: 0}, 0, memory.SpacePointer, 3, n+4)
	if k := kept(); len(k) != 0 || !g.trackers[run].open {
		t.Fatalf("after a new high: rows %v kept, open %v", k, g.trackers[run].open)
	}
	for i, s := range g.seals {
		if s.trackers != 0 || len(s.shares) != 0 {
			t.Errorf("seal %d: %d trackers, %d shares", i, s.trackers, len(s.shares))
		}
	}
}

// TestExitKeepsSharesOnce: an exit seals the run's and the interval's
// open peaks on one event, so they share one seal, whose table keeps each
// row's share once; the interval's next read leaves it to the run's.
func TestExitKeepsSharesOnce(t *testing.T) {
	l := New()
	const n = 100
	for i := range n {
		l.Alloc(Key{PID: 10, Stack: StackID(i)}, uint64(i), memory.SpacePointer, 1, uint64(i))
	}
	l.Exit(10, n)
	g := l.groups[PeakKey{PID: 10, GPU: "0"}]
	s := g.trackers[run].seal
	if s == nil || g.trackers[interval].seal != s || s.trackers != 2 || len(s.shares) != n {
		t.Fatalf("after the exit: run at %p, interval at %p, %+v", s, g.trackers[interval].seal, g.seals)
	}
	want := map[PeakKey]peakWant{{PID: 10, GPU: "0"}: {Amount{n, n}, n - 1, map[Key]Amount{}}}
	for i := range n {
		want[PeakKey{PID: 10, GPU: "0"}].rows[Key{PID: 10, Stack: StackID(i)}] = Amount{1, 1}
	}
	checkPeaks(t, "interval", l.TakeIntervalPeaks(n+1), want)
	if g.trackers[interval].seal != nil || s.trackers != 1 || len(s.shares) != n {
		t.Errorf("after the interval's read: %+v", *s)
	}
	checkPeaks(t, "run", l.Peaks(), want)
}

// TestIntervalPeaksReuseTheirRows: the agent reads every interval's peak,
// with a share of each row; the rows go into one buffer, reused.
func TestIntervalPeaksReuseTheirRows(t *testing.T) {
	l := newBenchLedger(1000)
	l.Free(1, cuMemFree, 0, 1<<20)
	now := uint64(1 << 20)
	allocs := testing.AllocsPerRun(10, func() {
		now++
		if p := l.TakeIntervalPeaks(now); len(p) != 1 || len(p[0].Rows) != 100 {
			t.Fatalf("peaks %+v", p)
		}
	})
	if allocs > 1 { // the slice of peaks
		t.Errorf("%v allocations a read", allocs)
	}
}

// TestRowSize: the books hold a row per stack; the agent's memory with
// 100,000 stacks counts every byte of it twice (Go's heap grows to twice
// what is live). Peaks keep their shares elsewhere.
func TestRowSize(t *testing.T) {
	if size := unsafe.Sizeof(row{}); size > 104 {
		t.Errorf("a row is %d bytes, more than 104", size)
	}
}

var pytorchFree = opNamed("pytorch:free")

// TestPeaksMatchFullRecount runs random allocations, frees (some late, some
// unknown), retains, exits and interval reads, and checks every peak
// against one found the slow way: every group's rows recounted from the
// live maps after every event, copied at each new high.
func TestPeaksMatchFullRecount(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	l := New()
	run, interval := map[PeakKey]peakWant{}, map[PeakKey]peakWant{}
	recount := func(ts uint64) {
		for k, rows := range heldRows(l) {
			total := sum(rows)
			for _, peaks := range []map[PeakKey]peakWant{run, interval} {
				if total.Bytes > peaks[k].total.Bytes {
					peaks[k] = peakWant{total, ts, rows}
				}
			}
		}
	}
	var ts uint64
	for range 20000 {
		ts++
		pid := uint32(10 + rng.IntN(3))
		addr := uint64(rng.IntN(64))
		switch n := rng.IntN(100); {
		case n < 45:
			kinds := []memory.Kind{memory.KindDevice, memory.KindVMM, memory.KindTensor, memory.KindHost}
			k := Key{PID: pid, Stack: StackID(rng.IntN(8)), Kind: kinds[rng.IntN(len(kinds))], Device: int32(rng.IntN(2))}
			space := memory.SpacePointer
			switch k.Kind {
			case memory.KindVMM:
				space = memory.SpaceHandle
			case memory.KindTensor:
				space = memory.SpaceTensor
			}
			l.Alloc(k, addr, space, uint64(1+rng.IntN(1000)), ts)
		case n < 88:
			ops := []memory.Op{cuMemFree, cuMemRelease, pytorchFree}
			// Some frees are late: stamped before events already accounted.
			l.Free(pid, ops[rng.IntN(len(ops))], addr, ts-uint64(rng.IntN(3)))
		case n < 93:
			l.Retain(pid, addr)
		case n < 95:
			l.Exit(pid, ts)
		case n < 97:
			l.DropExited(func(uint32) bool { return false })
			for k := range run {
				if l.groups[k] == nil {
					delete(run, k)
					delete(interval, k)
				}
			}
		default:
			checkPeaks(t, fmt.Sprintf("interval at %d", ts), l.TakeIntervalPeaks(ts), nonZero(interval))
			clear(interval)
			for k, rows := range heldRows(l) {
				interval[k] = peakWant{sum(rows), ts, rows}
			}
		}
		recount(ts)
		if t.Failed() {
			t.Fatalf("at %d", ts)
		}
	}
	checkPeaks(t, "run", l.Peaks(), nonZero(run))
}

// heldRows recounts what each group's rows hold from the live maps.
func heldRows(l *Ledger) map[PeakKey]map[Key]Amount {
	groups := map[PeakKey]map[Key]Amount{}
	for k := range l.groups {
		groups[k] = map[Key]Amount{}
	}
	for _, p := range l.procs {
		for _, a := range p.live {
			k := a.row.key()
			rows := groups[peakKey(k)]
			held := rows[k]
			rows[k] = Amount{held.Bytes + a.bytes, held.Count + 1}
		}
	}
	return groups
}

func sum(rows map[Key]Amount) Amount {
	var total Amount
	for _, a := range rows {
		total.Bytes += a.Bytes
		total.Count += a.Count
	}
	return total
}

func nonZero(peaks map[PeakKey]peakWant) map[PeakKey]peakWant {
	out := map[PeakKey]peakWant{}
	for k, p := range peaks {
		if p.total.Bytes > 0 {
			out[k] = p
		}
	}
	return out
}

// BenchmarkTakeIntervalPeaks reads the peak of a process holding 100,000
// rows: the cost of a read, once an interval, O(rows of the group).
func BenchmarkTakeIntervalPeaks(b *testing.B) {
	l := New()
	for i := range 100000 {
		l.Alloc(Key{PID: 1, Stack: StackID(i), Kind: memory.KindDevice}, uint64(i), memory.SpacePointer, 4096, uint64(i))
	}
	l.Free(1, cuMemFree, 0, 1<<20) // sealed: the shares of the rows since kept
	var now uint64 = 1 << 20
	for b.Loop() {
		now++
		if p := l.TakeIntervalPeaks(now); len(p) != 1 || len(p[0].Rows) < 99999 {
			b.Fatalf("%d peaks", len(p))
		}
	}
}

// TestIntervalLow: a row's low-water mark is the least it held since the
// interval began, 0 for a row made during it; the next interval starts it
// at what the row holds, and an interval without events keeps it there.
func TestIntervalLow(t *testing.T) {
	l := New()
	l.Alloc(weights, 0x1000, memory.SpacePointer, 100, 1)
	l.Alloc(weights, 0x2000, memory.SpacePointer, 50, 2)
	l.Free(10, cuMemFree, 0x2000, 3)
	if low := l.IntervalLow(weights); low != 0 {
		t.Errorf("a row made during the interval: low %d, want 0", low)
	}
	l.TakeIntervalPeaks(4)
	l.Alloc(weights, 0x3000, memory.SpacePointer, 30, 5)
	l.Free(10, cuMemFree, 0x1000, 6)
	l.Alloc(weights, 0x4000, memory.SpacePointer, 70, 7)
	if low := l.IntervalLow(weights); low != 30 {
		t.Errorf("low %d, want 30 (100 at the start, 130, then 30, then 100)", low)
	}
	l.TakeIntervalPeaks(8)
	if low := l.IntervalLow(weights); low != 100 {
		t.Errorf("an interval without events: low %d, want what the row holds, 100", low)
	}
	l.Alloc(weights, 0x4000, memory.SpacePointer, 20, 9) // the driver handed 0x4000 out again: its 70 bytes freed
	if low := l.IntervalLow(weights); low != 30 {
		t.Errorf("after a reuse of an address: low %d, want 30", low)
	}
	if low := l.IntervalLow(cache); low != 0 {
		t.Errorf("a row not in the books: low %d, want 0", low)
	}
}
