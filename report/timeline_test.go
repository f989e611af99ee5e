package report

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// timelineReport: a process on GPU 0 holding weights, with a spike of
// activations from two call sites of one function (two stacks that read
// the same) in bucket 1, then the weights alone, carried on for two
// buckets; its peak is the spike.
func timelineReport() *snapshot.Snapshot {
	weights := []*symbolize.Frame{{Function: "cuMemAlloc_v2"}, {Function: "load_weights", File: "train.py", Line: 3}, {Function: "main"}}
	spikeA := []*symbolize.Frame{{Function: "cuMemAlloc_v2"}, {Function: "activations"}, {Function: "main"}}
	spikeB := []*symbolize.Frame{{Function: "cuMemAlloc_v2"}, {Function: "activations"}, {Function: "main"}}
	held := []snapshot.Holder{{Kind: memory.KindDevice, Frames: weights, Bytes: 8 * MiB}}
	spike := []snapshot.Holder{{Kind: memory.KindDevice, Frames: spikeA, Bytes: 5 * MiB}, {Kind: memory.KindDevice, Frames: weights, Bytes: 8 * MiB},
		{Kind: memory.KindDevice, Frames: spikeB, Bytes: 4 * MiB}}
	ms := time.Millisecond
	tl := &snapshot.Timeline{Timestamp: 1000, Width: 10 * ms, End: 35 * ms, Series: []snapshot.TimelineSeries{{
		PID: 7, Comm: "python3", GPU: "0", View: memory.ViewDriver, Buckets: []snapshot.TimelineBucket{
			{Min: 0, Max: 8 * MiB, MaxTime: 2 * ms, Top: held},
			{Min: 8 * MiB, Max: 17*MiB + 100, MaxTime: 14 * ms, Top: spike, Other: 100},
			{Min: 8 * MiB, Max: 8 * MiB, MaxTime: 20 * ms, Top: held},
			{Min: 8 * MiB, Max: 8 * MiB, MaxTime: 30 * ms, Top: held},
		}}}}
	peak := snapshot.Peak{PID: 7, GPU: "0", View: memory.ViewDriver, Timestamp: 1000 + uint64(14*ms), Amount: accounting.Amount{Bytes: 17*MiB + 100},
		Rows: []snapshot.Row{
			{Key: accounting.Key{PID: 7, Kind: memory.KindDevice}, Frames: weights, Counters: accounting.Counters{AllocBytes: 8 * MiB}},
			{Key: accounting.Key{PID: 7, Kind: memory.KindDevice}, Frames: spikeA, Counters: accounting.Counters{AllocBytes: 5 * MiB}},
			{Key: accounting.Key{PID: 7, Kind: memory.KindDevice}, Frames: spikeB, Counters: accounting.Counters{AllocBytes: 4 * MiB}},
			{Key: accounting.Key{PID: 7, Kind: memory.KindDevice}, Frames: []*symbolize.Frame{{Function: "cuMemAlloc_v2"}, {Function: "small"}},
				Counters: accounting.Counters{AllocBytes: 100}},
		}}
	return &snapshot.Snapshot{Timeline: tl, Peaks: []snapshot.Peak{peak}}
}

// TestTimelinePage: the page's timeline names each stack once, sums the
// stacks that read the same, writes a level carried on once, and carries
// the run's peak with every stack, at its time since the start.
func TestTimelinePage(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteHTML(&buf, timelineReport()); err != nil {
		t.Fatal(err)
	}
	page := pageData(t, buf.String())
	tl := page.Timeline
	if tl == nil || len(tl.Series) != 1 || tl.Width != int64(10*time.Millisecond) || tl.End != int64(35*time.Millisecond) || tl.Top != accounting.TimelineTop {
		t.Fatalf("timeline %+v", tl)
	}
	label := func(pair [2]uint64) string { return tl.Stacks[pair[0]].Label }
	s := tl.Series[0]
	spike := s.Buckets[1]
	if len(spike.Top) != 2 || label(spike.Top[0]) != "activations" || spike.Top[0][1] != 9*MiB || label(spike.Top[1]) != "load_weights" || spike.Other != 100 {
		t.Errorf("spike bucket %+v", spike)
	}
	if b := s.Buckets[2]; b.Same || len(b.Top) != 1 || !s.Buckets[3].Same || s.Buckets[3].Top != nil {
		t.Errorf("carried level: %+v then %+v", b, s.Buckets[3])
	}
	if len(tl.Stacks) != 3 {
		t.Errorf("stacks %+v", tl.Stacks)
	}
	if first := tl.Stacks[s.Buckets[0].Top[0][0]]; tl.Frames[first.Frames[0]].Name != "main" || tl.Frames[first.Frames[1]].Where != "train.py:3" {
		t.Errorf("weights' frames %v of %v, want outermost first", first.Frames, tl.Frames)
	}
	if pk := s.Peak; pk == nil || pk.At != int64(14*time.Millisecond) || pk.Bytes != 17*MiB+100 || len(pk.Top) != 3 || pk.Top[0][1] != 9*MiB {
		t.Errorf("peak %+v", pk)
	}
}

// TestNoTimeline: a report without one (the agent's, WriteHTML's callers
// but record's) says null, and the page hides the section.
func TestNoTimeline(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteHTML(&buf, snapshot.Snapshot{}.With(viewRows()...)); err != nil {
		t.Fatal(err)
	}
	if page := pageData(t, buf.String()); page.Timeline != nil {
		t.Errorf("timeline %+v", page.Timeline)
	}
}

// pageData reads back the data a page embeds.
func pageData(t *testing.T, html string) flamePage {
	t.Helper()
	const open = `<script type="application/json" id="profile">`
	i := strings.Index(html, open)
	j := strings.Index(html[i:], "</script>")
	var page flamePage
	if i < 0 || j < 0 {
		t.Fatal("no data in the page")
	}
	if err := json.Unmarshal([]byte(html[i+len(open):i+j]), &page); err != nil {
		t.Fatal(err)
	}
	return page
}
