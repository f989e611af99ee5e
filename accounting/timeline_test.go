package accounting

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/memory"
)

// moment is a group's rows after a change, as the tests recount them.
type moment struct {
	ts   uint64
	rows map[Key]Amount
}

// history records every group's rows after every event, recounted from
// the live maps: the slow truth a timeline is checked against.
type history map[PeakKey][]moment

func (h history) record(l *Ledger, ts uint64) {
	for k, rows := range heldRows(l) {
		past := h[k]
		if n := len(past); n > 0 && sum(past[n-1].rows) == sum(rows) && equalRows(past[n-1].rows, rows) {
			continue // unchanged
		}
		h[k] = append(past, moment{ts, rows})
	}
}

func equalRows(a, b map[Key]Amount) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// check compares each bucket with the group's recounted moments in its
// span: the level it began with, then every change in it.
func (h history) check(t *testing.T, tl Timeline) {
	t.Helper()
	for _, s := range tl.Series {
		past := h[s.PeakKey]
		for i, b := range s.Buckets {
			from, to := tl.Start+uint64(i)*tl.Width, tl.Start+uint64(i+1)*tl.Width
			in := momentsIn(past, from, to)
			want := expectBucket(in)
			what := fmt.Sprintf("%+v bucket %d [%d, %d)", s.PeakKey, i, from, to)
			if b.Min != want.Min || b.Max != want.Max || b.MaxTime != want.MaxTime {
				t.Fatalf("%s: min %d max %d at %d; want min %d max %d at %d", what, b.Min, b.Max, b.MaxTime, want.Min, want.Max, want.MaxTime)
			}
			checkTop(t, what, b, want.Top)
		}
		if last := tl.Start + uint64(len(s.Buckets))*tl.Width; last <= tl.End {
			t.Errorf("%+v: %d buckets end at %d, before the timeline's end %d", s.PeakKey, len(s.Buckets), last, tl.End)
		}
	}
}

// momentsIn are the moments of a span: the level carried in at its start,
// then the changes in it.
func momentsIn(past []moment, from, to uint64) []moment {
	carried := moment{from, map[Key]Amount{}}
	var in []moment
	for _, m := range past {
		switch {
		case m.ts < from:
			carried.rows = m.rows
		case m.ts < to:
			in = append(in, m)
		}
	}
	return append([]moment{carried}, in...)
}

// expectBucket is a bucket found the slow way: its rows are the first
// moment at its highest, all of them, in Top, by bytes.
func expectBucket(in []moment) Bucket {
	b := Bucket{Min: ^uint64(0)}
	var at map[Key]Amount
	for _, m := range in {
		total := sum(m.rows).Bytes
		b.Min = min(b.Min, total)
		if at == nil || total > b.Max {
			b.Max, b.MaxTime, at = total, m.ts, m.rows
		}
	}
	for k, a := range at {
		if a.Bytes > 0 {
			b.Top = append(b.Top, Holder{Key: k, Bytes: a.Bytes})
		}
	}
	slices.SortFunc(b.Top, func(x, y Holder) int { return int(int64(y.Bytes) - int64(x.Bytes)) })
	return b
}

// checkTop: the bucket names the TimelineTop rows holding the most, each
// with its exact bytes at the bucket's highest moment, the rest in Other.
func checkTop(t *testing.T, what string, got Bucket, all []Holder) {
	t.Helper()
	want := map[Key]uint64{}
	for _, h := range all {
		want[h.Key] = h.Bytes
	}
	n := min(len(all), TimelineTop)
	var named uint64
	for i, h := range got.Top {
		if i > 0 && got.Top[i-1].Bytes < h.Bytes {
			t.Fatalf("%s: top not by bytes: %v", what, got.Top)
		}
		if want[h.Key] != h.Bytes {
			t.Fatalf("%s: %+v holds %d, want %d", what, h.Key, h.Bytes, want[h.Key])
		}
		named += h.Bytes
		delete(want, h.Key) // each row once
	}
	if len(got.Top) != n || n > 0 && got.Top[n-1].Bytes != all[n-1].Bytes {
		t.Fatalf("%s: top %v, want the %d holding the most of %v", what, got.Top, n, all)
	}
	if named+got.Other != got.Max {
		t.Fatalf("%s: top %d + other %d, max %d", what, named, got.Other, got.Max)
	}
}

// TestTimelineMatchesRecount runs random allocations, frees, exits and
// pauses (from microseconds to minutes: buckets with no event, and many
// doublings of the width) in processes with more stacks than a bucket
// names, and checks every bucket against the moments recounted the slow
// way: min and max exact, the rows at its highest exact. Addresses are not
// reused while live (a reuse frees the old allocation within the event,
// which a recount after each event cannot see).
func TestTimelineMatchesRecount(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	l := New()
	var ts uint64 = 1 << 30
	l.StartTimeline(ts)
	h := history{}
	var next uint64 = 1000 // the last address allocated
	for range 20000 {
		switch n := rng.IntN(1000); {
		case n < 2:
			ts += uint64(rng.Int64N(int64(2 * time.Minute)))
		case n < 50:
			ts += uint64(rng.Int64N(int64(50 * time.Millisecond)))
		default:
			ts += uint64(rng.IntN(int(200 * time.Microsecond)))
		}
		pid := uint32(10 + rng.IntN(2))
		switch n := rng.IntN(100); {
		case n < 52:
			kinds := []memory.Kind{memory.KindDevice, memory.KindTensor}
			k := Key{PID: pid, Stack: StackID(rng.IntN(24)), Kind: kinds[rng.IntN(2)], Device: int32(rng.IntN(2))}
			space := memory.SpacePointer
			if k.Kind == memory.KindTensor {
				space = memory.SpaceTensor
			}
			next++
			l.Alloc(k, next, space, uint64(1+rng.IntN(1000)), ts)
		case n < 99:
			ops := []memory.Op{cuMemFree, pytorchFree}
			l.Free(pid, ops[rng.IntN(2)], next-uint64(rng.IntN(400)), ts)
		default:
			l.Exit(pid, ts)
		}
		h.record(l, ts)
	}
	tl := l.Timeline(ts + uint64(time.Second))
	if tl.Width < uint64(time.Second) {
		t.Fatalf("width %v: the test did not double it enough", time.Duration(tl.Width))
	}
	if len(tl.Series) != len(h) {
		t.Errorf("%d series, want %d", len(tl.Series), len(h))
	}
	h.check(t, tl)
	checkPeaksInTimeline(t, l, tl)
}

// checkPeaksInTimeline: a group's highest bucket is its run's peak, at the
// same moment, with the same rows.
func checkPeaksInTimeline(t *testing.T, l *Ledger, tl Timeline) {
	t.Helper()
	peaks := map[PeakKey]Peak{}
	for _, p := range l.Peaks() {
		peaks[p.PeakKey] = p
	}
	for _, s := range tl.Series {
		top := slices.MaxFunc(s.Buckets, func(a, b Bucket) int { return int(int64(a.Max) - int64(b.Max)) })
		if p := peaks[s.PeakKey]; top.Max != p.Bytes || top.MaxTime != p.Time {
			t.Errorf("%+v: highest bucket %d at %d, peak %d at %d", s.PeakKey, top.Max, top.MaxTime, p.Bytes, p.Time)
		}
	}
}

// TestTimelineKeepsSpikeThroughMerges: a spike of a microsecond, in a
// bucket of the first width, stays exact after the width doubled 20 times
// (to 17 minutes a bucket): the merged bucket holding it has the spike as
// its max, the level before it as its min, and the spike's rows; and of
// two equal spikes, the first.
func TestTimelineKeepsSpikeThroughMerges(t *testing.T) {
	const ms = uint64(time.Millisecond)
	l := New()
	l.StartTimeline(0)
	l.Alloc(gpu1Weights, 1, memory.SpacePointer, 100, 5*ms)
	l.Alloc(gpu1Spike, 2, memory.SpacePointer, 900, 7*ms)
	l.Free(10, cuMemFree, 2, 7*ms+1000)
	l.Alloc(gpu1Higher, 3, memory.SpacePointer, 900, 300*ms) // as high, later
	l.Free(10, cuMemFree, 3, 300*ms+1000)
	l.Alloc(gpu1Spike, 2, memory.SpacePointer, 50, 600*ms)
	tl := l.Timeline(1 << 50)
	if doublings := tl.Width / ms; doublings < 1<<20 {
		t.Fatalf("width %v", time.Duration(tl.Width))
	}
	s := tl.Series[0]
	first := s.Buckets[0]
	want := Bucket{Min: 0, Max: 1000, MaxTime: 7 * ms, Top: []Holder{{gpu1Spike, 900}, {gpu1Weights, 100}}}
	if first.Min != want.Min || first.Max != want.Max || first.MaxTime != want.MaxTime || !slices.Equal(first.Top, want.Top) || first.Other != 0 {
		t.Errorf("bucket 0: %+v, want %+v", first, want)
	}
	last := s.Buckets[len(s.Buckets)-1]
	if last.Min != 150 || last.Max != 150 || !slices.Equal(last.Top, []Holder{{gpu1Weights, 100}, {gpu1Spike, 50}}) {
		t.Errorf("last bucket: %+v", last)
	}
	if len(s.Buckets) > TimelineBuckets {
		t.Errorf("%d buckets", len(s.Buckets))
	}
}

// TestTimelineLateEvent: an event stamped before the open bucket (a free
// racing with a reuse, taken after it) counts at the open bucket's start.
func TestTimelineLateEvent(t *testing.T) {
	const ms = uint64(time.Millisecond)
	l := New()
	l.StartTimeline(0)
	l.Alloc(gpu1Weights, 1, memory.SpacePointer, 100, ms/2)
	l.Alloc(gpu1Spike, 2, memory.SpacePointer, 200, 3*ms+5)
	l.Alloc(gpu1Spike, 3, memory.SpacePointer, 200, 3*ms+10)
	l.Free(10, cuMemFree, 1, 2*ms) // late: the open bucket is 3
	b := l.Timeline(4 * ms).Series[0].Buckets
	if len(b) != 5 || b[2].Min != 100 || b[3].Min != 100 || b[3].Max != 500 || b[3].MaxTime != 3*ms+10 || b[4].Min != 400 || b[4].Max != 400 {
		t.Errorf("buckets %+v", b)
	}
}

// TestTimelineBounded: a process allocating and freeing from 40 stacks
// for eleven simulated days, an event a second: each series holds at most
// TimelineBuckets buckets naming at most TimelineTop rows, and the heap
// after a million events is what it was after a hundred thousand.
func TestTimelineBounded(t *testing.T) {
	l := New()
	l.StartTimeline(0)
	ts := uint64(0)
	run := func(n int) {
		for i := range n {
			ts += uint64(time.Second)
			k := Key{PID: 10, Stack: StackID(i % 40), Kind: memory.KindDevice}
			l.Alloc(k, uint64(i%60), memory.SpacePointer, uint64(1+i%977), ts)
			l.Free(10, cuMemFree, uint64((i+30)%60), ts+1)
		}
	}
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	run(100_000)
	before := heap()
	run(900_000)
	after := heap()
	tl := l.Timeline(ts)
	for _, s := range tl.Series {
		tops := map[*Holder]bool{}
		for _, b := range s.Buckets {
			if len(b.Top) > TimelineTop {
				t.Fatalf("%d rows in a bucket", len(b.Top))
			}
			if len(b.Top) > 0 {
				tops[&b.Top[0]] = true
			}
		}
		if len(s.Buckets) > TimelineBuckets || len(tops) > TimelineBuckets {
			t.Errorf("%d buckets, %d compositions", len(s.Buckets), len(tops))
		}
	}
	// The ledger itself is bounded here (60 live allocations, 40 rows):
	// what grows would be the timeline's.
	if grew := int64(after) - int64(before); grew > 64<<10 {
		t.Errorf("heap grew by %d bytes from 100,000 to 1,000,000 events", grew)
	}
	t.Logf("heap %d -> %d bytes; width %v", before, after, time.Duration(tl.Width))
}

// BenchmarkAllocFreeTimeline is BenchmarkAllocFree's steady and waves
// patterns with a timeline kept, an event a microsecond: a bucket closes
// every thousand pairs at first, and its rows are read then.
func BenchmarkAllocFreeTimeline(b *testing.B) {
	b.Run("steady", func(b *testing.B) {
		l := newBenchLedger(1000)
		l.StartTimeline(0)
		var ts uint64 = 1 << 20
		for b.Loop() {
			ts += 1000
			l.Alloc(benchKey(int(ts)), 1<<30, memory.SpacePointer, 4096, ts)
			l.Free(1, cuMemFree, 1<<30, ts+1)
		}
	})
	b.Run("waves", func(b *testing.B) {
		const wave = 1000
		l := New()
		l.StartTimeline(0)
		var ts, height uint64
		for b.Loop() {
			height++
			for i := range uint64(wave) {
				ts += 1000
				l.Alloc(Key{PID: 1, Stack: StackID(i), Kind: memory.KindDevice}, i, memory.SpacePointer, 4096+height, ts)
			}
			for i := range uint64(wave) {
				ts += 1000
				l.Free(1, cuMemFree, i, ts)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/wave, "ns/pair")
	})
}
