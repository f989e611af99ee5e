package report

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

func TestGrowthLines(t *testing.T) {
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	frames := []*symbolize.Frame{{Function: "cuMemAlloc_v2"}, {Function: "Trainer.training_step", File: "train.py"},
		{Function: "train", File: "train.py"}, {Function: "<module>", File: "train.py"}, {Function: "main", File: "runpy.py"}}
	var growing []snapshot.Growing
	for i := range 6 {
		growing = append(growing, snapshot.Growing{Key: accounting.Key{PID: 4242, Stack: accounting.StackID(i), Kind: memory.KindTensor},
			Comm: "train.py", Frames: frames, BytesPerSecond: 3.1 * (1 << 20) / 60, Since: at.Add(-12 * time.Minute), At: at})
	}
	exhaustion := []snapshot.Exhaustion{
		{GPU: 0, Free: 16 << 30, BytesPerSecond: 116 << 20, Seconds: 840,
			Processes: []snapshot.ExhaustionShare{{PID: 4242, Comm: "train.py", Share: 1}}},
		{GPU: 1, Free: 60 << 30, BytesPerSecond: 1 << 20, Seconds: 61440},
	}
	want := []string{}
	for range 5 {
		want = append(want, "growing: pid 4242 (train.py): +3.1 MiB/min under Trainer.training_step <- train <- <module> for 12 min (tensor view, gpu 0)")
	}
	want = append(want, "growing: 1 more stacks",
		"exhaustion: gpu 0 runs out in 14 min at +116.0 MiB/s (16.0 GiB free): pid 4242 (train.py) 100%")
	if got := GrowthLines(growing, exhaustion); !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", fmt.Sprintln(got), fmt.Sprintln(want))
	}
}

func TestSpanAndRate(t *testing.T) {
	for d, want := range map[time.Duration]string{45 * time.Second: "45 s", 12*time.Minute + 5*time.Second: "12 min", 185 * time.Minute: "3 h 5 min"} {
		if got := Span(d); got != want {
			t.Errorf("Span(%v) = %q, want %q", d, got, want)
		}
	}
	for rate, want := range map[float64]string{512: "+30.0 KiB/min", 116 << 20: "+116.0 MiB/s"} {
		if got := Rate(rate); got != want {
			t.Errorf("Rate(%v) = %q, want %q", rate, got, want)
		}
	}
}
