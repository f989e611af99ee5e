package growth

import (
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

const MiB = 1 << 20

var (
	start = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	gpu0  = gpuinfo.Device{Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-0"}
	train = &snapshot.Process{Comm: "train.py", GPUs: map[int]gpuinfo.Device{0: gpu0}}
	leak  = accounting.Key{PID: 42, Stack: 1, Kind: memory.KindDevice, Device: 0}
	// weights and steady are rows of the same process that do not grow.
	weights = accounting.Key{PID: 42, Stack: 2, Kind: memory.KindDevice, Device: 0}
	tensors = accounting.Key{PID: 42, Stack: 3, Kind: memory.KindTensor, Device: 0}
)

// interval is the snapshot of interval i (ending 15 s after the one
// before), its rows' lows as given.
func interval(i int, lows map[accounting.Key]uint64, gpus *snapshot.GPUMemory) *snapshot.Snapshot {
	s := &snapshot.Snapshot{Time: start.Add(time.Duration(i) * 15 * time.Second), GPUMemory: gpus}
	for k, low := range lows {
		s.Entries = append(s.Entries, snapshot.Entry{Key: k, Counters: accounting.Counters{AllocBytes: low}, Low: low, Process: train})
	}
	return s
}

// TestLeakFoundAtTheFifthInterval: a row made in the first interval, its
// low rising 10 MiB an interval, is growing at the end of the fifth (four
// rises), with its rise over the four intervals before and its rate; the
// rows beside it, steady, are not.
func TestLeakFoundAtTheFifthInterval(t *testing.T) {
	var d Detector
	for i := 1; i <= 6; i++ {
		s := interval(i, map[accounting.Key]uint64{leak: uint64(i-1) * 10 * MiB, weights: 500 * MiB}, nil)
		d.Observe(s)
		if i < 5 {
			if len(s.Growing) != 0 {
				t.Fatalf("interval %d: growing %+v, want none before the fifth", i, s.Growing)
			}
			continue
		}
		if len(s.Growing) != 1 {
			t.Fatalf("interval %d: %d growing, want the leak alone", i, len(s.Growing))
		}
		g := s.Growing[0]
		wantSince := start.Add(15 * time.Second) // the end of the first interval, its low 0
		if g.Key != leak || g.Grew != 40*MiB || g.Window != time.Minute || g.Low != uint64(i-1)*10*MiB || !g.Since.Equal(wantSince) {
			t.Errorf("interval %d: %+v, want the leak, grown 40 MiB in a minute, growing since %v", i, g, wantSince)
		}
		if want := 40.0 * MiB / 60; g.BytesPerSecond != want {
			t.Errorf("interval %d: %.1f B/s, want %.1f", i, g.BytesPerSecond, want)
		}
		if g.Comm != "train.py" || g.Device != gpu0 {
			t.Errorf("interval %d: named %q on %+v", i, g.Comm, g.Device)
		}
	}
}

// TestWhatStopsGrowingIsNotGrowing: a row that rises for three intervals
// (a KV cache filling) is never growing; one that rises for six is while
// it rises, and not from the first interval it stays; a step's tensors,
// their low 0 every interval, never are.
func TestWhatStopsGrowingIsNotGrowing(t *testing.T) {
	var d Detector
	kv := accounting.Key{PID: 42, Stack: 4, Kind: memory.KindDevice, Device: 0}
	for i := 1; i <= 12; i++ {
		s := interval(i, map[accounting.Key]uint64{
			kv:      uint64(min(i, 4)) * 100 * MiB,
			leak:    uint64(min(i, 7)) * MiB,
			tensors: 0,
		}, nil)
		d.Observe(s)
		want := 0
		if i >= 5 && i <= 7 { // four rises to 5, 6, 7
			want = 1
		}
		if len(s.Growing) != want {
			t.Errorf("interval %d: growing %+v, want %d", i, s.Growing, want)
		}
		if want == 1 && s.Growing[0].Key != leak {
			t.Errorf("interval %d: %v growing, want the leak", i, s.Growing[0].Key)
		}
	}
	if len(d.rows) != 2 {
		t.Errorf("%d rows followed, want kv and the leak: their lows are not 0", len(d.rows))
	}
}

// TestRowsLetGo: a row whose low falls to 0, or that leaves the books, is
// let go; one of a process waiting for its stacks' names is kept, its
// history going on once it is back.
func TestRowsLetGo(t *testing.T) {
	var d Detector
	other := accounting.Key{PID: 43, Stack: 1, Kind: memory.KindDevice}
	for i := 1; i <= 4; i++ {
		d.Observe(interval(i, map[accounting.Key]uint64{leak: uint64(i) * MiB, other: uint64(i) * MiB}, nil))
	}
	s := interval(5, map[accounting.Key]uint64{leak: 0}, nil)
	s.Waiting = []uint32{43}
	d.Observe(s)
	if _, ok := d.rows[leak]; ok {
		t.Errorf("a row whose low fell to 0 is still followed")
	}
	s = interval(6, map[accounting.Key]uint64{other: 6 * MiB}, nil)
	d.Observe(s)
	if len(s.Growing) != 1 || s.Growing[0].Grew != 6*MiB {
		t.Errorf("the waiting process's row, back: %+v, want growing 6 MiB (0, 2, 3, 4, 6: four rises)", s.Growing)
	}
	d.Observe(interval(7, nil, nil))
	if len(d.rows) != 0 {
		t.Errorf("%d rows followed after they left the books", len(d.rows))
	}
}

// TestExhaustion: a GPU's free memory, as nvidia-smi says, over its
// processes' rates; a process growing in its tensor view alone fills its
// allocator's cache first; a GPU nothing grows on has none.
func TestExhaustion(t *testing.T) {
	gpus := &snapshot.GPUMemory{GPUs: []snapshot.GPU{
		{Index: 0, UUID: "GPU-0", Total: 80 << 30, Reserved: 512 * MiB, Used: 60 << 30},
		{Index: 1, UUID: "GPU-1", Total: 80 << 30, Used: 1 << 30},
	}}
	serve := &snapshot.Process{Comm: "serve.py", GPUs: map[int]gpuinfo.Device{0: gpu0}}
	kvTensors := accounting.Key{PID: 44, Stack: 9, Kind: memory.KindTensor, Device: 0}
	var d Detector
	var s *snapshot.Snapshot
	for i := 1; i <= 5; i++ {
		s = interval(i, map[accounting.Key]uint64{leak: uint64(i-1) * 60 * MiB, tensors: uint64(i-1) * 30 * MiB}, gpus)
		s.Entries = append(s.Entries, snapshot.Entry{Key: kvTensors, Low: uint64(i-1) * 15 * MiB, Process: serve})
		s.Breakdown = []snapshot.Breakdown{{PID: 44, GPU: "0", Parts: []snapshot.Part{{Category: snapshot.AllocatorCache, Bytes: 300 * MiB}}}}
		d.Observe(s)
	}
	if len(s.Growing) != 3 {
		t.Fatalf("growing %+v, want the leak, the tensors and the other process's tensors", s.Growing)
	}
	if len(s.Exhaustion) != 1 {
		t.Fatalf("exhaustion %+v, want GPU 0's alone", s.Exhaustion)
	}
	e := s.Exhaustion[0]
	// pid 42 grows 4 MiB/s in its driver view (its tensors, 2 MiB/s, are
	// inside); pid 44 1 MiB/s in its tensor view alone, 300 MiB of slack.
	wantFree := uint64(80<<30 - 512*MiB - 60<<30)
	if e.GPU != 0 || e.UUID != "GPU-0" || e.Free != wantFree || e.Slack != 300*MiB || e.BytesPerSecond != 5*MiB {
		t.Errorf("%+v, want GPU 0, free %d, slack 300 MiB, 5 MiB/s", e, wantFree)
	}
	if want := float64(wantFree+300*MiB) / (5 * MiB); e.Seconds != want {
		t.Errorf("%.3f s to exhaustion, want %.3f", e.Seconds, want)
	}
	if len(e.Processes) != 2 || e.Processes[0].PID != 42 || e.Processes[0].Share != 0.8 || e.Processes[1].PID != 44 || e.Processes[1].Share != 0.2 {
		t.Errorf("shares %+v, want pid 42 0.8, pid 44 0.2", e.Processes)
	}
}
