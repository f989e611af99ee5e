package report

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// timelinePage is what the HTML report draws of a snapshot.Timeline: per
// process, GPU and view, its buckets and its peak, stacks as indices into
// one table of stacks, frames as indices into one table of frames, so that
// a stack held in many buckets is written once. Times are ns since Start.
type timelinePage struct {
	Start  string           `json:"start"` // on the wall clock, for people
	Width  int64            `json:"width"`
	End    int64            `json:"end"`
	Top    int              `json:"top"` // the most stacks a bucket names
	Frames []pageFrame      `json:"frames"`
	Stacks []pageStack      `json:"stacks"`
	Series []timelineSeries `json:"series"`
}

type pageFrame struct {
	Name  string `json:"n"`
	Where string `json:"w,omitempty"`
}

// pageStack is a stack as the page shows it: its frames outermost first,
// as the flame graph stacks them, and the label of its band (HottestFrame).
type pageStack struct {
	Label  string `json:"l"`
	Frames []int  `json:"f"`
}

type timelineSeries struct {
	Process string           `json:"process"`
	PID     uint32           `json:"pid"`
	GPU     string           `json:"gpu"`
	View    string           `json:"view"`
	Buckets []timelineBucket `json:"buckets"`
	Peak    *timelineMoment  `json:"peak"` // the run's, from Snapshot.Peaks
}

// timelineBucket is a snapshot.TimelineBucket; Top as [stack, bytes]
// pairs, stacks that read the same (same frames: two call sites of one
// line) summed; Same when Top is the previous bucket's (a level carried
// on), to keep the page small.
type timelineBucket struct {
	Min   uint64      `json:"lo"`
	Max   uint64      `json:"hi"`
	At    int64       `json:"t"` // when Max was first reached
	Top   [][2]uint64 `json:"top,omitempty"`
	Same  bool        `json:"same,omitempty"`
	Other uint64      `json:"o,omitempty"`
}

// timelineMoment is a peak: every stack that held memory then.
type timelineMoment struct {
	At    int64       `json:"t"`
	Bytes uint64      `json:"bytes"`
	Top   [][2]uint64 `json:"top"`
}

// newTimelinePage is the page's timeline of r; nil without one.
func newTimelinePage(r *snapshot.Snapshot) *timelinePage {
	tl := r.Timeline
	if tl == nil {
		return nil
	}
	page := &timelinePage{Start: tl.Start.Format(time.RFC3339Nano), Width: int64(tl.Width), End: int64(tl.End),
		Top: accounting.TimelineTop, Frames: []pageFrame{}, Stacks: []pageStack{}, Series: []timelineSeries{}}
	stacks := newStackTable(page)
	for _, s := range tl.Series {
		series := timelineSeries{Process: processName(s.Comm, s.PID), PID: s.PID, GPU: s.GPU, View: s.View.String()}
		var previous [][2]uint64
		for _, b := range s.Buckets {
			bucket := timelineBucket{Min: b.Min, Max: b.Max, At: int64(b.MaxTime), Other: b.Other, Top: stacks.holders(b.Top)}
			if len(bucket.Top) > 0 && slices.Equal(bucket.Top, previous) {
				bucket.Top, bucket.Same = nil, true
			} else {
				previous = bucket.Top
			}
			series.Buckets = append(series.Buckets, bucket)
		}
		series.Peak = stacks.peak(r.Peaks, s, tl.Timestamp)
		page.Series = append(page.Series, series)
	}
	return page
}

// stackTable interns the page's frames and stacks.
type stackTable struct {
	page   *timelinePage
	frames map[pageFrame]int
	stacks map[string]int // by frame indices
	// seen are the stacks by their frame slice: the profiler shares a
	// stack's slice among the buckets that name it.
	seen map[**symbolize.Frame]int
}

func newStackTable(page *timelinePage) *stackTable {
	return &stackTable{page: page, frames: map[pageFrame]int{}, stacks: map[string]int{}, seen: map[**symbolize.Frame]int{}}
}

// stack is the index of a stack with these frames (innermost first).
func (t *stackTable) stack(frames []*symbolize.Frame) int {
	if len(frames) == 0 {
		return t.intern(frames)
	}
	n, ok := t.seen[&frames[0]]
	if !ok {
		n = t.intern(frames)
		t.seen[&frames[0]] = n
	}
	return n
}

// intern is the index of a stack with these frames, added if new.
func (t *stackTable) intern(frames []*symbolize.Frame) int {
	indices := make([]int, 0, len(frames))
	for i := len(frames) - 1; i >= 0; i-- {
		f := pageFrame{Name: frames[i].Name(), Where: where(*frames[i])}
		n, ok := t.frames[f]
		if !ok {
			n = len(t.page.Frames)
			t.page.Frames = append(t.page.Frames, f)
			t.frames[f] = n
		}
		indices = append(indices, n)
	}
	var key strings.Builder
	for _, n := range indices {
		key.WriteString(strconv.Itoa(n))
		key.WriteByte(',')
	}
	n, ok := t.stacks[key.String()]
	if !ok {
		n = len(t.page.Stacks)
		t.page.Stacks = append(t.page.Stacks, pageStack{Label: HottestFrame(frames), Frames: indices})
		t.stacks[key.String()] = n
	}
	return n
}

// holders are a bucket's stacks as [stack, bytes] pairs, by bytes,
// descending, stacks that read the same summed.
func (t *stackTable) holders(top []snapshot.Holder) [][2]uint64 {
	var out [][2]uint64
	at := map[uint64]int{} // each stack's place in out
	for _, h := range top {
		n := uint64(t.stack(h.Frames))
		if i, ok := at[n]; ok {
			out[i][1] += h.Bytes
			continue
		}
		at[n] = len(out)
		out = append(out, [2]uint64{n, h.Bytes})
	}
	slices.SortStableFunc(out, func(a, b [2]uint64) int { return cmp.Compare(b[1], a[1]) })
	return out
}

// peak is the run's peak of series s, every stack of it; nil if none.
func (t *stackTable) peak(peaks []snapshot.Peak, s snapshot.TimelineSeries, start uint64) *timelineMoment {
	i := slices.IndexFunc(peaks, func(pk snapshot.Peak) bool { return pk.PID == s.PID && pk.GPU == s.GPU && pk.View == s.View })
	if i < 0 {
		return nil
	}
	pk := peaks[i]
	top := make([]snapshot.Holder, 0, len(pk.Rows))
	for _, row := range pk.Rows {
		top = append(top, snapshot.Holder{Kind: row.Kind, Frames: row.Frames, Bytes: row.LiveBytes()})
	}
	return &timelineMoment{At: int64(pk.Timestamp - start), Bytes: pk.Bytes, Top: t.holders(top)}
}
