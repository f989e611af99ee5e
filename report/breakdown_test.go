package report

import (
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/snapshot"
)

// TestBreakdownLines: record's summary and top's header say each
// process's breakdown in one line, its parts largest first, what they sum
// to and the fragmentation.
func TestBreakdownLines(t *testing.T) {
	r := snapshot.Snapshot{}.With(viewRows()...)
	r.Breakdown = []snapshot.Breakdown{{PID: 7, Comm: "train", GPU: "0", NVML: true, Parts: []snapshot.Part{
		{Category: snapshot.Parameters, Bytes: 3 << 30}, {Category: snapshot.LibraryWorkspaces, Library: "cublas", Bytes: 8 << 20},
	}, Fragmentation: &snapshot.Fragmentation{FreeInSegments: 20 << 20, LargestFreeBlock: 2 << 20}}}
	var out strings.Builder
	if err := WriteStacks(&out, r, 1); err != nil {
		t.Fatal(err)
	}
	want := "where the GPU memory went (docs/breakdown.md):\n" +
		"pid 7 (train) gpu 0: 3.0 GiB (nvidia-smi): parameters 3.0 GiB, library_workspaces/cublas 8.0 MiB; free in segments 20.0 MiB, largest block 2.0 MiB\n"
	if !strings.Contains(out.String(), want) {
		t.Errorf("summary:\n%s\nwant:\n%s", out.String(), want)
	}
}
