package metrics

import (
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

type noTotals struct{}

func (noTotals) Totals() (snapshot.Totals, error) { return snapshot.Totals{}, nil }

// TestPeakGauges: each view's peak per process and GPU under its own
// gauge, labelled as the live bytes are but for kind; the rows of the
// peaks are not kept.
func TestPeakGauges(t *testing.T) {
	pod := container.Identity{Namespace: "ml", Pod: "trainer-1", Name: "trainer", PodUID: "uid", ContainerID: "cid"}
	held := snapshot.Row{Frames: []*symbolize.Frame{{Function: "forward"}}}
	var last LastInterval
	last.Set(&snapshot.Snapshot{Peaks: []snapshot.Peak{
		{PID: 7, Comm: "python3", GPU: "0", View: memory.ViewDriver, Container: pod, Amount: accounting.Amount{Bytes: 50 << 20, Count: 4}, Rows: []snapshot.Row{held}},
		{PID: 7, Comm: "python3", GPU: "0", View: memory.ViewTensor, Container: pod, Amount: accounting.Amount{Bytes: 16 << 20, Count: 2}},
		{PID: 7, Comm: "python3", GPU: "1", View: memory.ViewDriver, Container: pod, Amount: accounting.Amount{Bytes: 2 << 20, Count: 1}},
	}})
	if rows := last.Peaks()[0].Rows; rows != nil {
		t.Errorf("rows kept: %v", rows)
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(Collector{Source: noTotals{}, Peaks: &last})
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]float64{} // by metric, by gpu
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := labelMap(m)
			if f.GetName() == "gpumem_peak_bytes" || f.GetName() == "gpumem_tensor_peak_bytes" {
				want := map[string]string{"pid": "7", "comm": "python3", "gpu": labels["gpu"], "namespace": "ml", "pod": "trainer-1",
					"container": "trainer", "pod_uid": "uid", "container_id": "cid"}
				if !maps.Equal(labels, want) {
					t.Errorf("%s labels %v, want %v", f.GetName(), labels, want)
				}
				if got[f.GetName()] == nil {
					got[f.GetName()] = map[string]float64{}
				}
				got[f.GetName()][labels["gpu"]] = m.GetGauge().GetValue()
			}
		}
	}
	if !maps.Equal(got["gpumem_peak_bytes"], map[string]float64{"0": 50 << 20, "1": 2 << 20}) ||
		!maps.Equal(got["gpumem_tensor_peak_bytes"], map[string]float64{"0": 16 << 20}) {
		t.Errorf("peaks %v", got)
	}
}

func labelMap(m *dto.Metric) map[string]string {
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	return labels
}

// TestBreakdownGauges: one gauge per part of each process's breakdown on
// each GPU, labelled with its category and library; its stacks not kept.
func TestBreakdownGauges(t *testing.T) {
	pod := container.Identity{Namespace: "ml", Pod: "trainer-1", Name: "trainer", PodUID: "uid", ContainerID: "cid"}
	var last LastInterval
	last.Set(&snapshot.Snapshot{Breakdown: []snapshot.Breakdown{{PID: 7, Comm: "python3", GPU: "0", Container: pod, Parts: []snapshot.Part{
		{Category: snapshot.Parameters, Bytes: 100 << 20, Top: []snapshot.Holding{{Bytes: 100 << 20}}},
		{Category: snapshot.LibraryWorkspaces, Library: "cublas", Bytes: 8 << 20},
	}}}})
	if top := last.Breakdown()[0].Parts[0].Top; top != nil {
		t.Errorf("stacks kept: %v", top)
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(Collector{Source: noTotals{}, Breakdown: &last})
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := labelMap(m)
			if f.GetName() != BreakdownName {
				continue
			}
			want := map[string]string{"pid": "7", "comm": "python3", "gpu": "0", "namespace": "ml", "pod": "trainer-1",
				"container": "trainer", "pod_uid": "uid", "container_id": "cid", "category": labels["category"], "library": labels["library"]}
			if !maps.Equal(labels, want) {
				t.Errorf("labels %v, want %v", labels, want)
			}
			got[labels["category"]+"/"+labels["library"]] = m.GetGauge().GetValue()
		}
	}
	if want := map[string]float64{"parameters/": 100 << 20, "library_workspaces/cublas": 8 << 20}; !maps.Equal(got, want) {
		t.Errorf("gauges %v, want %v", got, want)
	}
}
