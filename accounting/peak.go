package accounting

import (
	"math"

	"github.com/gpu-mem/gpu-mem/memory"
)

// Peaks.
//
// Every row belongs to one group: a process's memory in one view
// (memory.View: the driver's and the tensors' overlap, so each has peaks of
// its own) on one GPU as rows label it. A group keeps its live total as
// allocations enter and leave the live map, and three trackers of the
// highest total: one over the whole run, one over the agent's interval, one
// over the timeline's open bucket (timeline.go; dormant without one).
//
// No event copies rows. A new high only notes the total and the time: the
// peak stays open, the rows as they stand being the peak's, until the first
// decrease after it seals it. After that, a row keeps its share of the peak
// in a field of its own when it first changes (copy on write), so the
// peak's rows are always at hand: a row's kept share if it changed since
// the seal, else what it holds. A seal is a counter's increment, so every
// event costs O(1), whatever the pattern: per tracker, a comparison, and at
// most one copy of 16 bytes into the row. Reading a peak costs O(rows of
// its group): 1.3 ms for 100,000 rows (BenchmarkTakeIntervalPeaks). Memory: per row, its held memory and, per tracker, its share
// and the seal it was kept at, with its key and group and its place in the
// group's list: 128 bytes (measured with its allocation: 311 bytes a live
// row, from 174; 279 with two trackers); per group, three trackers. So a
// peak's copy lives in its rows, one per tracker.
//
// Order. A peak is the highest total in the order the books take events,
// the ring buffer's. A free racing with a reuse of its address on another
// thread comes after the reuse; but the reuse says that the driver had
// freed the old allocation, so the reuse takes it out of the totals (see
// Alloc), and the late free changes them no more. Calls of one thread, and
// calls serialized by a lock the probe fires under (PyTorch's allocator),
// come in the order of their timestamps. Calls on two threads within the
// microseconds between an event's timestamp and its sending (an
// allocation's stack is read in between) may come in the other order;
// their peak is the one of the order they came in.

// PeakKey names a group of rows: one process's memory in one view on one
// GPU.
type PeakKey struct {
	PID  uint32
	View memory.View
	// GPU is where the memory lives, as Key.GPU labels the group's rows: a
	// device ordinal, "host" (page-locked memory and VMM memory on the
	// host), "managed" or "unknown".
	GPU string
}

func peakKey(k Key) PeakKey { return PeakKey{PID: k.PID, View: k.Kind.View(), GPU: k.GPU()} }

// Amount is memory held: bytes, and the allocations (objects) that hold
// them.
type Amount struct {
	Bytes, Count uint64
}

// PeakRow is what one row held at a peak.
type PeakRow struct {
	Key
	Amount
}

// Peak is the highest live total of a group, and the rows that held it.
type Peak struct {
	PeakKey
	Amount // the group's total at the peak, the sum of its rows'
	// Time is the BPF timestamp (ns since boot) of the event that reached
	// the peak: the first to reach it, if it was reached again. For an
	// interval's peak at the level the interval began with, the interval's
	// start.
	Time uint64
	Rows []PeakRow // the rows holding memory at the peak, in no order
}

// row is one row of the books, and what peaks need of it.
type row struct {
	Counters
	key   Key
	group *group
	// held is what the row's allocations in the live map hold: its live
	// memory, less any allocation whose address the driver handed out
	// again before its free event came (the driver had freed it). Peaks
	// count held memory.
	held Amount
	// atSeal is, per tracker, what the row held when the peak was sealed,
	// kept at its first change after: valid when kept at the tracker's
	// current seal.
	atSeal [trackers]Amount
	keptAt [trackers]uint64
}

// The trackers of each group.
const (
	run = iota
	interval
	bucketPeak // the timeline's open bucket's (timeline.go)
	trackers
)

// dormant is a tracker that never moves: without a timeline, bucketPeak.
// Its peak is never exceeded, and it is sealed at seal 0, the seal rows
// start at, so no row ever keeps a share for it.
var dormant = tracker{peak: Amount{Bytes: math.MaxUint64}}

// group keeps the peaks of one PeakKey.
type group struct {
	live     Amount // its rows' held memory
	rows     []*row
	trackers [trackers]tracker
	series   *series // its timeline, if the ledger keeps one
}

// group returns the group of k, created at time ts if new.
func (l *Ledger) group(k PeakKey, ts uint64) *group {
	g, ok := l.groups[k]
	if !ok {
		// Open at zero: the rows as they stand, none, are the peak's. A
		// sealed tracker's seal is never 0, the seal a new row is at.
		g = &group{trackers: [trackers]tracker{{open: true}, {open: true}, dormant}}
		if l.timeline != nil {
			l.timeline.follow(g, ts)
		}
		l.groups[k] = g
	}
	return g
}

// hold counts an allocation entering the live map at time ts.
func (r *row) hold(bytes, ts uint64) {
	g := r.group
	at := g.advance(ts)
	for i := range g.trackers {
		g.trackers[i].keep(r, i)
	}
	r.held.Bytes += bytes
	r.held.Count++
	g.live.Bytes += bytes
	g.live.Count++
	for i := range g.trackers {
		g.trackers[i].grew(g.live, ts)
	}
	g.note(at)
}

// unhold counts an allocation leaving the live map at time ts: a free, an
// exit, or a reuse of its address. It seals an open peak: the rows as they
// stand are the peak's.
func (r *row) unhold(bytes, ts uint64) {
	g := r.group
	at := g.advance(ts)
	for i := range g.trackers {
		t := &g.trackers[i]
		t.close()
		t.keep(r, i)
	}
	r.held.Bytes -= bytes
	r.held.Count--
	g.live.Bytes -= bytes
	g.live.Count--
	g.note(at)
}

// advance moves the group's timeline, if any, to time ts before its total
// changes, and returns the time the change counts at there.
func (g *group) advance(ts uint64) uint64 {
	if g.series == nil {
		return ts
	}
	return g.series.advance(g, ts)
}

// note counts the group's new total, changed at time at, in its timeline.
func (g *group) note(at uint64) {
	if g.series != nil {
		g.series.note(g.live.Bytes, at)
	}
}

// tracker follows the highest live total of a group.
type tracker struct {
	peak Amount
	time uint64
	// open: nothing left the live map since the peak was reached, so the
	// rows as they stand are the peak's.
	open bool
	seal uint64 // counts the seals, so that a row knows whether it kept its share
}

// grew notes that the group's total rose to live at ts.
func (t *tracker) grew(live Amount, ts uint64) {
	if live.Bytes > t.peak.Bytes {
		t.peak, t.time, t.open = live, ts, true
	}
}

// close seals an open peak before the group's total leaves it.
func (t *tracker) close() {
	if t.open {
		t.open = false
		t.seal++
	}
}

// keep has row r, about to change, keep its share of tracker i's sealed
// peak, unless it already did.
func (t *tracker) keep(r *row, i int) {
	if !t.open && r.keptAt[i] != t.seal {
		r.atSeal[i], r.keptAt[i] = r.held, t.seal
	}
}

// share is what row r held at tracker i's peak.
func (t *tracker) share(r *row, i int) Amount {
	if !t.open && r.keptAt[i] == t.seal {
		return r.atSeal[i]
	}
	return r.held
}

// read returns tracker i's peak with its rows; false when the group held
// no memory.
func (g *group) read(k PeakKey, i int) (Peak, bool) {
	t := &g.trackers[i]
	if t.peak.Bytes == 0 {
		return Peak{}, false
	}
	p := Peak{PeakKey: k, Amount: t.peak, Time: t.time, Rows: make([]PeakRow, 0, len(g.rows))}
	for _, r := range g.rows {
		if a := t.share(r, i); a != (Amount{}) {
			p.Rows = append(p.Rows, PeakRow{Key: r.key, Amount: a})
		}
	}
	return p, true
}

// restart begins a new interval at time now with the group's live memory:
// an interval's peak is never below the level it begins with.
func (t *tracker) restart(live Amount, now uint64) {
	t.peak, t.time, t.open = live, now, true
}

// Peaks returns each group's highest live total since the books began,
// with the rows that held it, in no order; a group that never held memory
// is left out. A process's exit releases its memory after its peak, which
// stays until DropExited drops the process.
func (l *Ledger) Peaks() []Peak {
	var peaks []Peak
	for k, g := range l.groups {
		if p, ok := g.read(k, run); ok {
			peaks = append(peaks, p)
		}
	}
	return peaks
}

// TakeIntervalPeaks returns each group's highest live total since the
// previous call (since the books began, at the first), with the rows that
// held it, in no order, and starts the next interval at now (a BPF
// timestamp): the agent calls it once per interval. An interval's peak is
// at least the level the interval began with, so a group holding memory
// has one every interval; a group that held none is left out.
func (l *Ledger) TakeIntervalPeaks(now uint64) []Peak {
	var peaks []Peak
	for k, g := range l.groups {
		if p, ok := g.read(k, interval); ok {
			peaks = append(peaks, p)
		}
		g.trackers[interval].restart(g.live, now)
	}
	return peaks
}
