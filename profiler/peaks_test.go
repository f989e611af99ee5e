package profiler

import (
	"maps"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// namedStack interns a stack of pid named function, as resolve would.
func namedStack(p *Profiler, pid uint32, function string, pc uint64) accounting.StackID {
	id := rawStackOf(p, pid, pc)
	nameStack(p, id, function)
	return id
}

// intervalPeaks are the peaks of the interval it ends.
func intervalPeaks(t *testing.T, p *Profiler) []snapshot.Peak {
	t.Helper()
	return endInterval(t, p).Peaks
}

// peakShares are a peak's rows as function: bytes.
func peakShares(t *testing.T, p *Profiler, pk snapshot.Peak) map[string]uint64 {
	t.Helper()
	shares := map[string]uint64{}
	for _, s := range pk.Shares {
		frames := p.stacks.stackFrames(s.Stack)
		if s.PID != pk.PID || s.GPU() != pk.GPU || s.Kind.View() != pk.View || len(frames) != 2 {
			t.Errorf("share %+v in peak %d %s %s", s, pk.PID, pk.GPU, pk.View)
		}
		shares[frames[1].Function] += s.Bytes
	}
	return shares
}

// TestPeaksNamed: the books' peaks with their rows' frames, process and
// GPU, by PID, GPU and view, on the wall clock; the interval's start
// with the level it began with; --gpu limits them as it limits rows.
func TestPeaksNamed(t *testing.T) {
	p := bareProfiler(t)
	p.procs.pids[7] = &tracked{proc: &process{Process: snapshot.Process{Comm: "train"}}}
	weights, activations := namedStack(p, 7, "load_weights", 0x401000), namedStack(p, 7, "activations", 0x402000)
	tensors := namedStack(p, 7, "forward", 0x403000)
	start := bpfNow()
	l := p.books.ledger
	l.Alloc(accounting.Key{PID: 7, Stack: weights, Kind: memory.KindDevice, Device: 1}, 0x1000, memory.SpacePointer, 100, start)
	l.Alloc(accounting.Key{PID: 7, Stack: activations, Kind: memory.KindDevice, Device: 1}, 0x2000, memory.SpacePointer, 300, start+1)
	l.Alloc(accounting.Key{PID: 7, Stack: tensors, Kind: memory.KindTensor, Device: 1}, 0x2000, memory.SpaceTensor, 250, start+2)
	l.Alloc(accounting.Key{PID: 7, Stack: weights, Kind: memory.KindDevice, Device: 0}, 0x3000, memory.SpacePointer, 64, start+4)
	freeOp := freeOpOf(t)
	l.Free(7, freeOp, 0x2000, start+5)

	peaks := intervalPeaks(t, p)
	want := []struct {
		gpu    string
		view   memory.View
		bytes  uint64
		ts     uint64
		shares map[string]uint64
	}{
		{"0", memory.ViewDriver, 64, start + 4, map[string]uint64{"load_weights": 64}},
		{"1", memory.ViewDriver, 400, start + 1, map[string]uint64{"load_weights": 100, "activations": 300}},
		{"1", memory.ViewTensor, 250, start + 2, map[string]uint64{"forward": 250}},
	}
	if len(peaks) != len(want) {
		t.Fatalf("%d peaks, want %d: %+v", len(peaks), len(want), peaks)
	}
	for i, w := range want {
		pk := peaks[i]
		if pk.PID != 7 || pk.Comm != "train" || pk.GPU != w.gpu || pk.View != w.view || pk.Bytes != w.bytes || pk.Timestamp != w.ts {
			t.Errorf("peak %d: %d %s %s %s %d bytes at %d, want %s %s %d at %d", i, pk.PID, pk.Comm, pk.GPU, pk.View, pk.Bytes, pk.Timestamp, w.gpu, w.view, w.bytes, w.ts)
		}
		if pk.Rows != nil {
			t.Errorf("peak %d: an interval's peak with rows named: %+v", i, pk.Rows)
		}
		if got := peakShares(t, p, pk); !maps.Equal(got, w.shares) {
			t.Errorf("peak %d: shares %v, want %v", i, got, w.shares)
		}
		if age := time.Since(pk.Time); age < 0 || age > time.Minute {
			t.Errorf("peak %d at %v, %v ago", i, pk.Time, age)
		}
	}

	// The next interval: the level it began with, at its start.
	next := intervalPeaks(t, p)
	if len(next) != 3 || next[1].Bytes != 100 || next[1].Timestamp <= start+5 || next[2].Bytes != 250 {
		t.Errorf("next interval %+v", next)
	}

	p.cfg.GPUs = []int{1}
	r, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Peaks) != 2 || r.Peaks[0].GPU != "1" || r.Peaks[0].Bytes != 400 || r.Peaks[1].View != memory.ViewTensor {
		t.Errorf("report peaks on GPU 1: %+v", r.Peaks)
	}
}

func freeOpOf(t *testing.T) memory.Op {
	for op := range memory.Op(64) {
		if op.Symbol() == "cuMemFree_v2" {
			return op
		}
	}
	t.Fatal("no cuMemFree_v2")
	return 0
}

// TestIntervalPeaksNameTheirStacks: a stack of an interval's peak that the
// background namer has not reached yet is named before the snapshot is
// taken, so that the snapshot has its row: a peak, unlike live bytes,
// cannot wait for the next interval.
func TestIntervalPeaksNameTheirStacks(t *testing.T) {
	p := bareProfiler(t)
	id := rawStackOf(p, 8, 0x401000)
	key := accounting.Key{PID: 8, Stack: id, Kind: memory.KindDevice}
	start := bpfNow()
	p.books.ledger.Alloc(key, 0x1000, memory.SpacePointer, 64, start)
	p.books.ledger.Free(8, freeOpOf(t), 0x1000, start+1)

	s := endInterval(t, p)
	if len(s.Peaks) != 1 || len(s.Peaks[0].Shares) != 1 || s.Peaks[0].Shares[0].Key != key || s.Peaks[0].Bytes != 64 {
		t.Fatalf("peaks %+v", s.Peaks)
	}
	var listed []accounting.Key
	s.EachRow(func(r *snapshot.Row) { listed = append(listed, r.Key) })
	if len(listed) != 1 || listed[0] != key {
		t.Errorf("the snapshot has rows %v, want the peak's row %v", listed, key)
	}
}
