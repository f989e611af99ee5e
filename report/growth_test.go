package report

import (
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

func reportAt(at time.Time, live map[accounting.StackID]uint64) *snapshot.Snapshot {
	r := &snapshot.Snapshot{Time: at}
	for stack, bytes := range live {
		r.Add(snapshot.Row{Key: accounting.Key{PID: 7, Stack: stack}, Counters: accounting.Counters{AllocBytes: bytes}})
	}
	return r
}

func TestGrowthOverWindow(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	g := &Growth{Window: time.Minute}
	a, b := accounting.Key{PID: 7, Stack: 1}, accounting.Key{PID: 7, Stack: 2}
	for _, step := range []struct {
		after time.Duration
		live  map[accounting.StackID]uint64
		want  map[accounting.Key]int64
	}{
		{0, map[accounting.StackID]uint64{1: 100}, map[accounting.Key]int64{a: 0}},
		// Shorter than the window: since the first sample; b is new.
		{30 * time.Second, map[accounting.StackID]uint64{1: 150, 2: 10}, map[accounting.Key]int64{a: 50, b: 10}},
		{61 * time.Second, map[accounting.StackID]uint64{1: 300, 2: 10}, map[accounting.Key]int64{a: 200, b: 10}},
		// The window now starts at 30s: the baseline is that sample.
		{90 * time.Second, map[accounting.StackID]uint64{1: 310, 2: 4}, map[accounting.Key]int64{a: 160, b: -6}},
	} {
		r := reportAt(t0.Add(step.after), step.live)
		got := g.Observe(r)
		if len(got) != len(step.want) {
			t.Errorf("at %v: %v, want %v", step.after, got, step.want)
		}
		for k, v := range step.want {
			if got[k] != v {
				t.Errorf("at %v: stack %d grew %d, want %d", step.after, k.Stack, got[k], v)
			}
		}
		if step.after == 90*time.Second {
			growers := Growers(r, got, 3)
			if len(growers) != 1 || growers[0].Key != a || growers[0].Growth != 160 {
				t.Errorf("growers %+v", growers)
			}
		}
	}
}

func TestSignedBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 512: "+512 B", -1536: "-1.5 KiB", 3 << 20: "+3.0 MiB"} {
		if got := SignedBytes(n); got != want {
			t.Errorf("%d: %q, want %q", n, got, want)
		}
	}
	for d, want := range map[time.Duration]string{time.Minute: "1m", 30 * time.Second: "30s", 90 * time.Second: "1m30s"} {
		if got := windowName(d); got != want {
			t.Errorf("%v: %q, want %q", d, got, want)
		}
	}
}
