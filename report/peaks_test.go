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

var spikeFrames = []*symbolize.Frame{{Function: "cuMemAlloc_v2"}, {Function: "forward_activation"}}

// peakReport: viewRows' processes, and their peaks: process 7 held 50 MiB
// on GPU 0 at its driver view's peak (the 20 MiB segment and a 30 MiB
// spike since freed) and 16 MiB of tensors at its tensor view's; process 8
// held its 8 MiB all along.
func peakReport() *snapshot.Snapshot {
	rows := viewRows()
	at := time.Date(2026, 12, 1, 12, 3, 4, 123000000, time.UTC)
	share := func(pid uint32, stack accounting.StackID, kind memory.Kind, frames []*symbolize.Frame, bytes, count uint64) snapshot.Row {
		return snapshot.Row{Key: accounting.Key{PID: pid, Stack: stack, Kind: kind}, Comm: "python3", Frames: frames,
			Counters: accounting.Counters{AllocBytes: bytes, AllocCount: count}}
	}
	spike := share(7, 9, memory.KindDevice, spikeFrames, 30*MiB, 3)
	spike.Counters.FreeBytes, spike.Counters.FreeCount = 30*MiB, 3
	return snapshot.Snapshot{Peaks: []snapshot.Peak{
		{PID: 7, Comm: "python3", GPU: "0", View: memory.ViewDriver, Time: at, Amount: accounting.Amount{Bytes: 50 * MiB, Count: 4},
			Rows: []snapshot.Row{share(7, 9, memory.KindDevice, spikeFrames, 30*MiB, 3), share(7, 1, memory.KindDevice, allocFrames, 20*MiB, 1)}},
		{PID: 7, Comm: "python3", GPU: "0", View: memory.ViewTensor, Time: at.Add(time.Second), Amount: accounting.Amount{Bytes: 16 * MiB, Count: 2},
			Rows: []snapshot.Row{share(7, 2, memory.KindTensor, tensorFrames, 16*MiB, 2)}},
		{PID: 8, Comm: "python3", GPU: "0", View: memory.ViewDriver, Time: at.Add(-time.Minute), Amount: accounting.Amount{Bytes: 8 * MiB, Count: 1},
			Rows: []snapshot.Row{share(8, 4, memory.KindDevice, cublasFrames, 8*MiB, 1)}},
	}}.With(append(rows, spike)...)
}

// TestFoldedPeak: --value peak folds each process's peak rows in one view,
// each with its share; a stack freed before the report is there.
func TestFoldedPeak(t *testing.T) {
	for view, want := range map[memory.View]string{
		memory.ViewDriver: "python3;gpu=0;cublasCreate_v2;cuMemAlloc_v2 8388608\n" +
			"python3;gpu=0;forward_activation;cuMemAlloc_v2 31457280\n" +
			"python3;gpu=0;load_weights;c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block;cuMemAlloc_v2 20971520\n",
		memory.ViewTensor: "python3;gpu=0;load_weights;c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc;pytorch:malloc 16777216\n",
	} {
		var buf bytes.Buffer
		if err := WriteFolded(&buf, peakReport(), Peak, view); err != nil {
			t.Fatal(err)
		}
		if buf.String() != want {
			t.Errorf("%s view:\n%s\nwant\n%s", view, buf.String(), want)
		}
	}
	if _, err := ParseValue("peak"); err != nil {
		t.Error(err)
	}
}

// TestJSONPeaks: each peak with its view, time, total and stacks, which
// sum to it.
func TestJSONPeaks(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, peakReport()); err != nil {
		t.Fatal(err)
	}
	var out struct {
		Peaks []struct {
			PID         uint32
			GPU, View   string
			Time        time.Time
			Bytes       uint64
			Allocations uint64
			Stacks      []struct {
				Kind        string
				Frames      []struct{ Function string }
				Bytes       uint64
				Allocations uint64
			}
		}
	}
	if err := json.Unmarshal(buf.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Peaks) != 3 {
		t.Fatalf("%d peaks", len(out.Peaks))
	}
	p := out.Peaks[0]
	if p.PID != 7 || p.GPU != "0" || p.View != "driver" || p.Bytes != 50*MiB || p.Allocations != 4 ||
		!p.Time.Equal(time.Date(2026, 12, 1, 12, 3, 4, 123000000, time.UTC)) || len(p.Stacks) != 2 {
		t.Fatalf("peak %+v", p)
	}
	if s := p.Stacks[0]; s.Kind != "device" || s.Bytes != 30*MiB || s.Allocations != 3 || s.Frames[1].Function != "forward_activation" {
		t.Errorf("first stack %+v", s)
	}
	if out.Peaks[1].View != "tensor" || out.Peaks[1].Stacks[0].Bytes != 16*MiB {
		t.Errorf("tensor peak %+v", out.Peaks[1])
	}
}

// TestStacksShowPeaks: --top's summary shows each view's peaks, highest
// first, beside what the process holds now, and the stack that held the
// most then.
func TestStacksShowPeaks(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteStacks(&buf, peakReport(), 5); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"GPU memory (driver view), peaks (the most each process held at once on a GPU; never added):\n" +
			"50.0 MiB peak at 12:03:04.123, pid 7 (python3), gpu 0 (26.0 MiB live now); most (30.0 MiB) by forward_activation\n" +
			"8.0 MiB peak at 12:02:04.123, pid 8 (python3), gpu 0 (8.0 MiB live now); most (8.0 MiB) by cublasCreate_v2\n",
		"tensors (tensor view), peaks (the most each process held at once on a GPU; never added):\n" +
			"16.0 MiB peak at 12:03:05.123, pid 7 (python3), gpu 0 (12.0 MiB live now); most (16.0 MiB) by load_weights\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no\n%s\nin\n%s", want, out)
		}
	}
}

// TestTopShowsPeaks: top's table of peaks, per process, GPU and view,
// the driver view first.
func TestTopShowsPeaks(t *testing.T) {
	var buf bytes.Buffer
	r := peakReport()
	r.Time = time.Now()
	if err := WriteTop(&buf, r, 10, nil); err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(buf.String(), "peaks since start (the most each process held at once, per GPU and view; never added):\n")
	if !ok {
		t.Fatalf("no peaks in\n%s", buf.String())
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(table), "\n") {
		got = append(got, strings.Join(strings.Fields(line), " "))
	}
	want := []string{
		"PID COMM POD GPU VIEW LIVE PEAK PEAK AT MOST AT PEAK",
		"7 python3 - 0 driver 26.0 MiB 50.0 MiB 12:03:04.123 forward_activation (30.0 MiB)",
		"8 python3 - 0 driver 8.0 MiB 8.0 MiB 12:02:04.123 cublasCreate_v2 (8.0 MiB)",
		"7 python3 - 0 tensor 12.0 MiB 16.0 MiB 12:03:05.123 load_weights (16.0 MiB)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("peaks table:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
