package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
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

// TestTopAndJSONSayWhatGrows: top's GROWING column is what the row's
// growing stacks grew, "-" where none grows, and the growing stack's line
// is under the table; record's JSON has the growing stack with its frames
// and the GPU's exhaustion with its shares.
func TestTopAndJSONSayWhatGrows(t *testing.T) {
	r := peakReport()
	r.Time = time.Date(2026, 12, 1, 12, 5, 0, 0, time.UTC)
	growing := snapshot.Growing{Key: accounting.Key{PID: 7, Stack: 2, Kind: memory.KindTensor}, Comm: "python3", Frames: tensorFrames,
		Low: 12 * MiB, Grew: 4 * MiB, Window: time.Minute, BytesPerSecond: 4.0 * MiB / 60, Since: r.Time.Add(-2 * time.Minute), At: r.Time}
	r.Growing = []snapshot.Growing{growing}
	r.Exhaustion = []snapshot.Exhaustion{{GPU: 0, UUID: "GPU-0", Free: 1 << 30, BytesPerSecond: growing.BytesPerSecond, Seconds: 15360,
		Processes: []snapshot.ExhaustionShare{{PID: 7, Comm: "python3", BytesPerSecond: growing.BytesPerSecond, Share: 1}}}}
	var top bytes.Buffer
	if err := WriteTop(&top, r, 10, r.Growing); err != nil {
		t.Fatal(err)
	}
	grew := map[string]string{}
	for _, line := range strings.Split(top.String(), "\n") {
		f := strings.Fields(line)
		if len(f) > 8 && f[0] == "7" {
			grew[f[3]] = f[7] + " " + f[8] // LIVE is two fields
		}
	}
	if grew["tensor"] != "+4.0 MiB" || !strings.HasPrefix(grew["device"], "- ") {
		t.Errorf("GROWING of pid 7: %v, want +4.0 MiB for its tensors, - for its device memory\n%s", grew, top.String())
	}
	if want := "growing: pid 7 (python3): +4.0 MiB/min under load_weights for 2 min (tensor view, gpu 0)\n"; !strings.Contains(top.String(), want) {
		t.Errorf("no %q in\n%s", want, top.String())
	}
	var js bytes.Buffer
	if err := WriteJSON(&js, r); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Growing []struct {
			PID       uint32 `json:"pid"`
			View      string `json:"view"`
			GrewBytes uint64 `json:"grew_bytes"`
			Frames    []struct {
				Function string `json:"function"`
			} `json:"frames"`
		} `json:"growing"`
		Exhaustion []struct {
			Seconds   float64 `json:"seconds"`
			Processes []struct {
				PID   uint32  `json:"pid"`
				Share float64 `json:"share"`
			} `json:"processes"`
		} `json:"exhaustion"`
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Growing) != 1 || got.Growing[0].PID != 7 || got.Growing[0].View != "tensor" || got.Growing[0].GrewBytes != 4*MiB ||
		got.Growing[0].Frames[len(got.Growing[0].Frames)-1].Function != "load_weights" {
		t.Errorf("growing %+v", got.Growing)
	}
	if len(got.Exhaustion) != 1 || got.Exhaustion[0].Seconds != 15360 || got.Exhaustion[0].Processes[0].PID != 7 || got.Exhaustion[0].Processes[0].Share != 1 {
		t.Errorf("exhaustion %+v", got.Exhaustion)
	}
}
