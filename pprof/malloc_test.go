package pprof

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// TestMallocProfiles: the profile Inspektor Gadget's dashboard reads has
// one sample type, malloc in bytes, and no period type; each interval's
// samples are the driver view's bytes allocated in it, by stack; a stack
// that allocated nothing in an interval, and the tensor view, have none.
func TestMallocProfiles(t *testing.T) {
	frames := func(fn string) []*symbolize.Frame {
		return []*symbolize.Frame{{Function: "cuMemAlloc_v2"}, {Function: fn, File: "model.py", Line: 3}}
	}
	kv := snapshot.Row{Key: accounting.Key{PID: 7, Stack: 1, Kind: memory.KindDevice}, Comm: "python3", Frames: frames("_allocate_kv_cache_tensors")}
	act := snapshot.Row{Key: accounting.Key{PID: 7, Stack: 2, Kind: memory.KindDevice}, Comm: "python3", Frames: frames("forward")}
	tensor := snapshot.Row{Key: accounting.Key{PID: 7, Stack: 3, Kind: memory.KindTensor}, Comm: "python3", Frames: frames("forward")}
	e := NewMallocEncoder()
	intervals := []struct {
		kv, act uint64 // allocated so far
		want    map[string]int64
	}{
		{kv: 1 << 30, act: 4096, want: map[string]int64{"_allocate_kv_cache_tensors": 1 << 30, "forward": 4096}},
		{kv: 1 << 30, act: 3 * 4096, want: map[string]int64{"forward": 2 * 4096}},
	}
	for i, iv := range intervals {
		kv.AllocBytes, act.AllocBytes, tensor.AllocBytes = iv.kv, iv.act, 1<<20*uint64(i+1)
		for _, r := range []*snapshot.Row{&kv, &act, &tensor} {
			e.Add(r, accounting.Amount{})
		}
		var buf bytes.Buffer
		if err := e.WriteTo(&buf, time.Unix(1000+int64(i), 0), time.Second); err != nil {
			t.Fatal(err)
		}
		p, err := profile.Parse(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.SampleType) != 1 || p.SampleType[0].Type != "malloc" || p.SampleType[0].Unit != "bytes" || (p.PeriodType != nil && *p.PeriodType != (profile.ValueType{})) {
			t.Fatalf("interval %d: sample types %v, period type %v", i, p.SampleType, p.PeriodType)
		}
		got := map[string]int64{}
		for _, s := range p.Sample {
			got[s.Location[1].Line[0].Function.Name] += s.Value[0]
		}
		if len(got) != len(iv.want) {
			t.Errorf("interval %d: %v, want %v", i, got, iv.want)
		}
		for fn, bytes := range iv.want {
			if got[fn] != bytes {
				t.Errorf("interval %d: %s %d, want %d", i, fn, got[fn], bytes)
			}
		}
	}
}
