package metrics

import (
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

type fixedTotals snapshot.Totals

func (f fixedTotals) Totals() (snapshot.Totals, error) { return snapshot.Totals(f), nil }

// TestGPUObservabilityMetrics: Inspektor Gadget's dashboard names, per
// process and memory class, from the driver view alone: device, VMM and
// managed memory summed under host_raw "0", host-pinned and VMM memory
// placed on the host under "1", the tensor view left out; the three counters of a class carry the same
// labels, so that the dashboard's alloc - free - implicit is the live
// bytes.
func TestGPUObservabilityMetrics(t *testing.T) {
	pod := container.Identity{Namespace: "ml", Pod: "trainer-0", Name: "trainer", PodUID: "uid", ContainerID: "cid"}
	series := func(kind memory.Kind, device int32, c accounting.Counters) snapshot.Series {
		return snapshot.Series{SeriesKey: snapshot.SeriesKey{PID: 7, Kind: kind, Device: device}, Comm: "python3", Container: pod, Counters: c}
	}
	totals := fixedTotals{Series: []snapshot.Series{
		series(memory.KindDevice, 0, accounting.Counters{AllocBytes: 1000, FreeBytes: 300, ImplicitFreeBytes: 100}),
		series(memory.KindDevice, 1, accounting.Counters{AllocBytes: 50}),
		series(memory.KindVMM, 0, accounting.Counters{AllocBytes: 4096, FreeBytes: 4096}),
		series(memory.KindManaged, memory.DeviceUnknown, accounting.Counters{AllocBytes: 8, ImplicitFreeBytes: 8}),
		series(memory.KindHost, memory.DeviceUnknown, accounting.Counters{AllocBytes: 64, FreeBytes: 32}),
		series(memory.KindVMM, memory.DeviceHost, accounting.Counters{AllocBytes: 2048, ImplicitFreeBytes: 2048}),
		series(memory.KindTensor, 0, accounting.Counters{AllocBytes: 1 << 30}),
	}}
	registry := prometheus.NewPedanticRegistry()
	registry.MustRegister(Collector{Source: totals, GPUObservability: true})
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]float64{} // by metric, by host_raw
	for _, f := range families {
		if f.GetName() != IGAllocBytesName && f.GetName() != IGFreeBytesName && f.GetName() != IGImplicitFreeBytesName {
			continue
		}
		got[f.GetName()] = map[string]float64{}
		for _, m := range f.GetMetric() {
			labels := labelMap(m)
			host := map[string]string{"0": "CUDA_MEM_DEVICE", "1": "CUDA_MEM_HOST"}[labels[LabelHostRaw]]
			want := map[string]string{"pid": "7", "comm": "python3", LabelHost: host, LabelHostRaw: labels[LabelHostRaw],
				LabelIGNamespace: "ml", LabelIGPod: "trainer-0", LabelIGContainer: "trainer"}
			if !maps.Equal(labels, want) {
				t.Errorf("%s labels %v, want %v", f.GetName(), labels, want)
			}
			got[f.GetName()][labels[LabelHostRaw]] = m.GetCounter().GetValue()
		}
	}
	want := map[string]map[string]float64{
		IGAllocBytesName:        {"0": 1000 + 50 + 4096 + 8, "1": 64 + 2048},
		IGFreeBytesName:         {"0": 300 + 4096, "1": 32},
		IGImplicitFreeBytesName: {"0": 100 + 8, "1": 2048},
	}
	for name, w := range want {
		if !maps.Equal(got[name], w) {
			t.Errorf("%s %v, want %v", name, got[name], w)
		}
	}

	registry = prometheus.NewPedanticRegistry()
	registry.MustRegister(Collector{Source: totals})
	families, err = registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == IGAllocBytesName {
			t.Errorf("sent without GPUObservability")
		}
	}
}
