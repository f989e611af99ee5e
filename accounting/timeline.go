package accounting

// Timeline.
//
// With a timeline started (StartTimeline: gpumem record's HTML report
// asks for one, the agent does not), every group also keeps its live
// total over time, in at most TimelineBuckets buckets of one width shared
// by all groups. When an event comes past the last bucket, the width
// doubles and every group merges its buckets in pairs: memory stays
// bounded whatever the duration, and the buckets stay exact, since a
// bucket keeps the lowest and the highest live total in it (a merged pair
// the lower of the two lows and the higher of the highs), never an
// average that a spike would vanish in.
//
// A bucket also keeps the rows that held the most at its highest moment
// (TimelineTop of them, the rest summed as other), so that a click on the
// timeline shows what filled memory then. That moment is found as peaks
// are: a third tracker per group (bucketPeak), restarted as each bucket
// opens, keeps the rows' shares of the bucket's highest total by copy on
// write, so every event still costs O(1): the totals are compared with the
// bucket's low and high, and the rows are read only when the group's
// bucket closes, at its first event in a later bucket (O(rows of the
// group), at most once per bucket). A merged pair keeps the rows of the
// higher of its two highs, the earlier on a tie: the first moment of the
// pair at its highest, as a peak's time is the first to reach it.
//
// Memory: per group, at most TimelineBuckets buckets of 56 bytes and a
// composition of at most TimelineTop rows of 16 bytes each, 160 KiB at
// most; buckets with no event in them share the composition of the level
// they carry on; the shares the third tracker keeps while sealed (peak.go).
// Without a timeline that tracker lies dormant (a comparison per event)
// and rows hold nothing for it.

import (
	"iter"
	"time"
)

const (
	// TimelineBuckets is the most buckets a group's timeline holds.
	TimelineBuckets = 512
	// TimelineTop is the most rows a bucket names; the rest are summed.
	TimelineTop = 16
	// firstWidth is the buckets' width until the first doubling: a
	// recording of half a second has 1 ms buckets.
	firstWidth = uint64(time.Millisecond)
)

// Timeline is each group's live total over time: bucket i of every series
// covers [Start + i*Width, Start + (i+1)*Width), the last ending at End or
// after. Times are BPF timestamps (ns since boot).
type Timeline struct {
	Start, Width, End uint64
	Series            []Series // in no order
}

// Series is one group's buckets, from the timeline's start to its end.
type Series struct {
	PeakKey
	Buckets []Bucket
}

// Bucket is one stretch of a group's live total.
type Bucket struct {
	// Min and Max are the lowest and the highest live total in the bucket,
	// the level it began with included. An address handed out again before
	// its free came releases the old allocation as the new one comes (see
	// Alloc): Min may show that moment.
	Min, Max uint64
	// MaxTime is when Max was first reached: the event that reached it, or
	// the bucket's start when it began at Max.
	MaxTime uint64
	// Top are the rows that held the most at MaxTime, by bytes,
	// descending; Other is what the other rows held then. They sum to Max.
	// Buckets may share a Top: read-only.
	Top   []Holder
	Other uint64
}

// Holder is a row's live bytes at one moment.
type Holder struct {
	Key
	Bytes uint64
}

// timeline is the clock all groups' buckets share.
type timeline struct {
	start, width uint64
	groups       map[PeakKey]*group // the ledger's
}

// series is a group's buckets; the last is open: the group's bucketPeak
// tracker follows its highest moment.
type series struct {
	tl      *timeline
	buckets []bucket
}

type bucket struct {
	min, max, maxTime uint64
	// top and other are the composition at maxTime: for the open bucket,
	// that of a closed bucket merged into it, if any; the tracker's, if
	// higher, at its close.
	top   []holder
	other uint64
}

// holder is a Holder as buckets keep it: the row rather than its key.
type holder struct {
	row   *row
	bytes uint64
}

// total is what the composition holds: its highest live total, or 0
// for none.
func (b *bucket) total() uint64 {
	sum := b.other
	for _, h := range b.top {
		sum += h.bytes
	}
	return sum
}

// StartTimeline starts keeping each group's live total over time, from
// now (a BPF timestamp) on: gpumem record calls it before the first event.
func (l *Ledger) StartTimeline(now uint64) {
	l.timeline = &timeline{start: now, width: firstWidth, groups: l.groups}
	for _, g := range l.groups {
		l.timeline.follow(g, now)
	}
}

// follow gives group g, created at time ts, a series: empty buckets up to
// ts, where its own opens.
func (tl *timeline) follow(g *group, ts uint64) {
	now := tl.bucketOf(tl.reach(ts))
	s := &series{tl: tl, buckets: make([]bucket, 0, now+1)}
	for i := range now {
		s.buckets = append(s.buckets, bucket{maxTime: tl.startOf(i)})
	}
	s.open(g, now)
	g.series = s
}

// reach doubles the width until time ts falls in the last bucket or
// before, and returns ts, no earlier than the timeline's start.
func (tl *timeline) reach(ts uint64) uint64 {
	ts = max(ts, tl.start)
	for tl.bucketOf(ts) >= TimelineBuckets {
		tl.width *= 2
		for _, g := range tl.groups {
			if g.series != nil { // nil: being followed
				g.series.mergePairs()
			}
		}
	}
	return ts
}

func (tl *timeline) bucketOf(ts uint64) int { return int((ts - tl.start) / tl.width) }
func (tl *timeline) startOf(i int) uint64   { return tl.start + uint64(i)*tl.width }
func (s *series) last() *bucket             { return &s.buckets[len(s.buckets)-1] }
func (s *series) lastIndex() int            { return len(s.buckets) - 1 }

// advance moves group g's series to time ts, before an event changes the
// group's total: the open bucket closes if ts is past it, the buckets in
// between carry on its level. It returns the time the event counts at: an
// event stamped before the open bucket (a late free, see Order in peak.go)
// counts at the open bucket's start, as the books take it after.
func (s *series) advance(g *group, ts uint64) uint64 {
	if ts < s.tl.startOf(len(s.buckets)) { // in the open bucket: most events
		return max(ts, s.tl.startOf(s.lastIndex()))
	}
	ts = s.tl.reach(ts)
	now := s.tl.bucketOf(ts)
	if now <= s.lastIndex() {
		return max(ts, s.tl.startOf(s.lastIndex()))
	}
	s.close(g)
	if s.lastIndex()+1 < now {
		level := bucket{min: g.live.Bytes, max: g.live.Bytes}
		level.top, level.other = compose(g.shares(nil))
		for i := s.lastIndex() + 1; i < now; i++ {
			level.maxTime = s.tl.startOf(i)
			s.buckets = append(s.buckets, level)
		}
	}
	s.open(g, now)
	return ts
}

// open opens bucket i at the group's level, and restarts the tracker of its
// highest moment.
func (s *series) open(g *group, i int) {
	start := s.tl.startOf(i)
	s.buckets = append(s.buckets, bucket{min: g.live.Bytes, max: g.live.Bytes, maxTime: start})
	g.trackers[bucketPeak].restart(g.live, start)
}

// close keeps the open bucket's composition at its highest moment: the
// tracker's, unless a bucket merged into it was as high.
func (s *series) close(g *group) {
	b := s.last()
	if t := &g.trackers[bucketPeak]; t.peak.Bytes > b.total() {
		b.top, b.other = compose(g.shares(t.seal))
	}
}

// note counts a change of the group's total to live at time ts.
func (s *series) note(live, ts uint64) {
	b := s.last()
	b.min = min(b.min, live)
	if live > b.max {
		b.max, b.maxTime = live, ts
	}
}

// mergePairs merges buckets 2i and 2i+1 into bucket i: the width doubled.
// The open bucket stays open, merged with the closed one before it, if
// any: its tracker goes on, and the higher of the two wins at its close.
func (s *series) mergePairs() {
	n := (len(s.buckets) + 1) / 2
	for i := range n {
		b := s.buckets[2*i]
		if 2*i+1 < len(s.buckets) {
			b = merge(b, s.buckets[2*i+1])
		}
		s.buckets[i] = b
	}
	clear(s.buckets[n:])
	s.buckets = s.buckets[:n]
}

// merge is two consecutive buckets as one: the composition of the higher
// high, the earlier's on a tie. The later one may be open: what it holds
// then is what was merged into it, and its tracker's composition, if
// higher, replaces it at its close.
func merge(a, b bucket) bucket {
	m := a
	m.min = min(a.min, b.min)
	if b.max > a.max {
		m.max, m.maxTime, m.top, m.other = b.max, b.maxTime, b.top, b.other
	}
	return m
}

// compose is the rows holding the most of shares, at most TimelineTop
// of them by bytes, descending, and what the others hold.
func compose(shares iter.Seq2[*row, Amount]) ([]holder, uint64) {
	var top []holder
	var other uint64
	for r, a := range shares {
		bytes := a.Bytes
		if bytes == 0 {
			continue
		}
		if len(top) == TimelineTop && bytes <= top[TimelineTop-1].bytes {
			other += bytes
			continue
		}
		if len(top) == TimelineTop {
			other += top[TimelineTop-1].bytes
			top = top[:TimelineTop-1]
		}
		i := len(top)
		for i > 0 && top[i-1].bytes < bytes {
			i--
		}
		top = append(top, holder{})
		copy(top[i+1:], top[i:])
		top[i] = holder{r, bytes}
	}
	return top, other
}

// Timeline returns each group's live total over time, from the timeline's
// start to now (a BPF timestamp), which it advances every group to; the
// open buckets are read, not closed. Groups that never held memory are
// left out. Without StartTimeline, an empty Timeline.
func (l *Ledger) Timeline(now uint64) Timeline {
	tl := l.timeline
	if tl == nil {
		return Timeline{}
	}
	now = tl.reach(now)
	for _, g := range l.groups {
		g.series.advance(g, now)
	}
	out := Timeline{Start: tl.start, Width: tl.width, End: now}
	for k, g := range l.groups {
		if g.trackers[run].peak.Bytes > 0 {
			out.Series = append(out.Series, Series{PeakKey: k, Buckets: g.series.read(g)})
		}
	}
	return out
}

// read copies the buckets, the open one with its composition so far.
func (s *series) read(g *group) []Bucket {
	out := make([]Bucket, len(s.buckets))
	shared := map[*holder][]Holder{} // buckets that share a composition share its copy
	for i, b := range s.buckets {
		if i == s.lastIndex() {
			b.top, b.other = s.openComposition(g)
		}
		out[i] = Bucket{Min: b.min, Max: b.max, MaxTime: b.maxTime, Other: b.other, Top: copyHolders(b.top, shared)}
	}
	return out
}

// openComposition is the open bucket's composition at its highest moment
// so far, as close would keep it.
func (s *series) openComposition(g *group) ([]holder, uint64) {
	b := s.last()
	if t := &g.trackers[bucketPeak]; t.peak.Bytes > b.total() {
		return compose(g.shares(t.seal))
	}
	return b.top, b.other
}

func copyHolders(top []holder, shared map[*holder][]Holder) []Holder {
	if len(top) == 0 {
		return nil
	}
	if c, ok := shared[&top[0]]; ok {
		return c
	}
	c := make([]Holder, len(top))
	for i, h := range top {
		c[i] = Holder{Key: h.row.key(), Bytes: h.bytes}
	}
	shared[&top[0]] = c
	return c
}
