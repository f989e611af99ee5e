package accounting

import (
	"iter"
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
// when it first changes (copy on write), in the seal's table of the rows
// changed since, so the peak's rows are always at hand: a row's kept share
// if it changed since the seal, else what it holds. Seals are numbered per
// group and a row notes the group's count at each change, so whether it
// changed since a seal is one comparison. Trackers that close on one event
// share its seal (the run's and the interval's, mostly: a new high of the
// run is one of the interval too), so a group is at one seal per tracker at
// most. Every event costs O(1), whatever the pattern: a comparison, and at a
// row's first change after a seal one append of 24 bytes per seal. Reading
// a peak costs O(rows of its group) (BenchmarkTakeIntervalPeaks).
//
// Memory. A row holds what every row needs, since the books hold one per
// stack: its counters, its key less the PID (its group's), its group, its
// held memory, the count of seals and the interval's low-water mark: 104
// bytes. Shares are kept only while
// a peak is sealed, and only for the rows changed since: 24 bytes each, one
// per row and seal at most; the most when a process exits (all its rows at
// once, in one table the run's and the interval's peaks share). They are
// let go when the trackers leave the seal (a new high, the next interval)
// or the process is dropped. Without a timeline its tracker never seals
// (dormant): the timeline costs the agent nothing per row.
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
	group *group
	// Its Key is its group's PID and these.
	stack  StackID
	kind   memory.Kind
	device int32
	// held is what the row's allocations in the live map hold: its live
	// memory, less any allocation whose address the driver handed out
	// again before its free event came (the driver had freed it). Peaks
	// count held memory.
	held Amount
	// changed is the group's count of seals when held last changed: a row
	// changed since a seal (changed >= its number) has its share of the
	// seal's peak in the seal's table, if it held anything then. A new row
	// starts at the count: it held nothing at earlier seals.
	changed uint64
	// low is the least held bytes since the interval began: what the row
	// kept all interval, whose rise interval after interval is a leak
	// (package growth). A row made during the interval held nothing at its
	// start.
	low uint64
}

// key is the row's Key.
func (r *row) key() Key { return Key{PID: r.group.pid, Stack: r.stack, Kind: r.kind, Device: r.device} }

// The trackers of each group.
const (
	run = iota
	interval
	bucketPeak // the timeline's open bucket's (timeline.go)
	trackers
)

// dormant is a tracker that never moves: without a timeline, bucketPeak.
// Its peak is never exceeded and it is never open, so it is never sealed
// and keeps no share.
var dormant = tracker{peak: Amount{Bytes: math.MaxUint64}}

// group keeps the peaks of one PeakKey.
type group struct {
	pid      uint32
	live     Amount // its rows' held memory
	rows     []*row
	trackers [trackers]tracker
	sealed   uint64 // the seals so far, the number of the last
	// seals holds the seals trackers are at, one per tracker at most
	// (trackers that close on one event share one), and free ones.
	seals  [trackers]seal
	series *series // its timeline, if the ledger keeps one
}

// seal is the moment one or more peaks of a group were sealed, at the
// first decrease after them: the rows as they stood then are theirs.
type seal struct {
	number   uint64
	trackers int // at it; a seal at none is free
	// shares are the rows changed since that held anything then, with what
	// they held.
	shares []share
}

// share is what a row held at a seal.
type share struct {
	row *row
	Amount
}

// keptShares is the most shares a free seal keeps room for, for the next
// seal: so that a pattern that seals again and again (a new high at every
// allocation; waves of a few thousand rows) allocates nothing, at 96 KiB a
// seal at most; a larger table (a process's exit keeps every row's share)
// is let go.
const keptShares = 4096

// group returns the group of k, created at time ts if new.
func (l *Ledger) group(k PeakKey, ts uint64) *group {
	g, ok := l.groups[k]
	if !ok {
		// Open at zero: the rows as they stand, none, are the peak's.
		g = &group{pid: k.PID, trackers: [trackers]tracker{{open: true}, {open: true}, dormant}}
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
	g.keep(r)
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
// exit, or a reuse of its address. It seals the open peaks: the rows as
// they stand are theirs.
func (r *row) unhold(bytes, ts uint64) {
	g := r.group
	at := g.advance(ts)
	g.close()
	g.keep(r)
	r.held.Bytes -= bytes
	r.held.Count--
	r.low = min(r.low, r.held.Bytes)
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

// close seals the group's open peaks, all at one new seal, before its
// total leaves them.
func (g *group) close() {
	var s *seal
	for i := range g.trackers {
		t := &g.trackers[i]
		if !t.open {
			continue
		}
		if s == nil {
			s = g.freeSeal()
			g.sealed++
			s.number = g.sealed
		}
		t.open, t.seal = false, s
		s.trackers++
	}
}

// freeSeal is a seal no tracker is at. There is one: each tracker is at
// one seal at most, and an open tracker at none.
func (g *group) freeSeal() *seal {
	for i := range g.seals {
		if g.seals[i].trackers == 0 {
			return &g.seals[i]
		}
	}
	panic("accounting: no free seal")
}

// keep has row r, about to change, keep its share of each seal since its
// last change, if it held anything.
func (g *group) keep(r *row) {
	if r.changed == g.sealed {
		return // no seal since
	}
	if r.held != (Amount{}) {
		for i := range g.seals {
			if s := &g.seals[i]; s.trackers > 0 && r.changed < s.number {
				s.shares = append(s.shares, share{r, r.held})
			}
		}
	}
	r.changed = g.sealed
}

// shares are the rows' shares at seal s, those that held something: the
// rows as they stand for none (an open peak's).
func (g *group) shares(s *seal) iter.Seq2[*row, Amount] {
	return func(yield func(*row, Amount) bool) {
		for _, r := range g.rows {
			if (s == nil || r.changed < s.number) && r.held != (Amount{}) {
				if !yield(r, r.held) {
					return
				}
			}
		}
		if s == nil {
			return
		}
		for _, sh := range s.shares {
			if !yield(sh.row, sh.Amount) {
				return
			}
		}
	}
}

// tracker follows the highest live total of a group.
type tracker struct {
	peak Amount
	time uint64
	// open: nothing left the live map since the peak was reached, so the
	// rows as they stand are the peak's. Else the rows at seal are (nil:
	// dormant).
	open bool
	seal *seal
}

// grew notes that the group's total rose to live at ts.
func (t *tracker) grew(live Amount, ts uint64) {
	if live.Bytes > t.peak.Bytes {
		t.restart(live, ts)
	}
}

// restart opens a new peak at live, reached at time ts: a new high, or a
// new interval or bucket, which is never below the level it begins with.
func (t *tracker) restart(live Amount, ts uint64) {
	if t.seal != nil {
		t.seal.leave()
		t.seal = nil
	}
	t.peak, t.time, t.open = live, ts, true
}

// leave is a tracker leaving the seal: freed at the last, its shares
// dropped.
func (s *seal) leave() {
	if s.trackers--; s.trackers > 0 {
		return
	}
	if cap(s.shares) > keptShares {
		s.shares = nil
	} else {
		s.shares = s.shares[:0] // rows of the group: kept alive by it anyway
	}
}

// read appends the rows of tracker i's peak to buf and returns the peak,
// its Rows in buf, and buf; false when the group held no memory.
func (g *group) read(k PeakKey, i int, buf []PeakRow) (Peak, []PeakRow, bool) {
	t := &g.trackers[i]
	if t.peak.Bytes == 0 {
		return Peak{}, buf, false
	}
	start := len(buf)
	for r, a := range g.shares(t.seal) {
		buf = append(buf, PeakRow{Key: r.key(), Amount: a})
	}
	return Peak{PeakKey: k, Amount: t.peak, Time: t.time, Rows: buf[start:len(buf):len(buf)]}, buf, true
}

// Peaks returns each group's highest live total since the books began,
// with the rows that held it, in no order; a group that never held memory
// is left out. A process's exit releases its memory after its peak, which
// stays until DropExited drops the process.
func (l *Ledger) Peaks() []Peak {
	var peaks []Peak
	buf := make([]PeakRow, 0, len(l.rows)) // a row is in its group's peak once at most
	for k, g := range l.groups {
		var p Peak
		var ok bool
		if p, buf, ok = g.read(k, run, buf); ok {
			peaks = append(peaks, p)
		}
	}
	return peaks
}

// TakeIntervalPeaks returns each group's highest live total since the
// previous call (since the books began, at the first), with the rows that
// held it, in no order, and starts the next interval at now (a BPF
// timestamp), each row's low-water mark (IntervalLow) at what it holds:
// the agent calls it once per interval. An interval's peak is
// at least the level the interval began with, so a group holding memory
// has one every interval; a group that held none is left out. The peaks'
// Rows are read into a buffer that the next call reuses: they are valid
// until then.
func (l *Ledger) TakeIntervalPeaks(now uint64) []Peak {
	var peaks []Peak
	buf := l.intervalRows[:0]
	if n := len(l.rows); cap(buf) < n || cap(buf) > 2*n {
		// Room for every row once, and for some more rows; not twice the
		// room the books need, after a burst of rows was dropped.
		buf = make([]PeakRow, 0, n+n/8)
	}
	for k, g := range l.groups {
		var p Peak
		var ok bool
		if p, buf, ok = g.read(k, interval, buf); ok {
			peaks = append(peaks, p)
		}
		g.trackers[interval].restart(g.live, now)
		for _, r := range g.rows {
			r.low = r.held.Bytes
		}
	}
	l.intervalRows = buf
	return peaks
}
