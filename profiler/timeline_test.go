package profiler

import (
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// TestTimelineNamed: a report's timeline names each bucket's stacks, by
// process, GPU and view, with times since its start; --gpu limits it as it
// limits rows; without Config.Timeline there is none.
func TestTimelineNamed(t *testing.T) {
	p := bareProfiler(t)
	p.procs.pids[7] = &tracked{proc: &process{Process: snapshot.Process{Comm: "train"}}}
	weights, activations := namedStack(p, 7, "load_weights", 0x401000), namedStack(p, 7, "activations", 0x402000)
	if r, _ := p.Snapshot(); r.Timeline != nil {
		t.Fatalf("a timeline without Config.Timeline: %+v", r.Timeline)
	}
	p.cfg.Timeline = true
	start := bpfNow()
	l := p.books.ledger
	l.StartTimeline(start)
	l.Alloc(accounting.Key{PID: 7, Stack: weights, Kind: memory.KindDevice, Device: 1}, 0x1000, memory.SpacePointer, 100, start+1)
	l.Alloc(accounting.Key{PID: 7, Stack: activations, Kind: memory.KindDevice, Device: 1}, 0x2000, memory.SpacePointer, 300, start+2)
	l.Free(7, freeOpOf(t), 0x2000, start+3)
	l.Alloc(accounting.Key{PID: 7, Stack: weights, Kind: memory.KindTensor, Device: 0}, 0x3000, memory.SpaceTensor, 64, start+4)

	p.cfg.GPUs = []int{1}
	r, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	tl := r.Timeline
	if tl == nil || len(tl.Series) != 1 || tl.Timestamp != start || tl.Width != time.Millisecond || tl.End <= 0 {
		t.Fatalf("timeline %+v", tl)
	}
	if age := time.Since(tl.Start); age < 0 || age > time.Minute {
		t.Errorf("started %v ago", age)
	}
	s := tl.Series[0]
	b := s.Buckets[0]
	if s.PID != 7 || s.Comm != "train" || s.GPU != "1" || s.View != memory.ViewDriver || b.Max != 400 || b.MaxTime != 2 ||
		len(b.Top) != 2 || b.Top[0].Frames[1].Function != "activations" || b.Top[0].Bytes != 300 || b.Top[1].Kind != memory.KindDevice {
		t.Errorf("series %+v, bucket 0 %+v", s, b)
	}
}
