package metrics

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/pyroscope"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// everyTotal has a sample of every metric of the books.
type everyTotal struct{}

func (everyTotal) Totals() (snapshot.Totals, error) {
	return snapshot.Totals{
		Series: []snapshot.Series{
			{SeriesKey: snapshot.SeriesKey{PID: 7, Kind: memory.KindDevice}, Comm: "python3"},
			{SeriesKey: snapshot.SeriesKey{PID: 7, Kind: memory.KindTensor}, Comm: "python3"},
		},
		Failures:       []snapshot.SeriesFailures{{SeriesKey: snapshot.SeriesKey{PID: 7, Kind: memory.KindDevice}, Comm: "python3", Result: 2, Count: 1}},
		Losses:         schema.Losses{schema.RingBufferFull: 1},
		TensorViews:    []snapshot.TensorView{{PID: 7, Since: time.Unix(1, 0)}},
		DriverViewsOff: []snapshot.DriverViewOff{{PID: 8, Ended: time.Unix(2, 0), Calls: 3}},
		GPUMemory:      &snapshot.GPUMemory{GPUs: []snapshot.GPU{{UUID: "GPU-1", Total: 2, Used: 1}}},
		State:          &snapshot.State{JournalBytes: 128, Refused: "object"},
	}, nil
}

type someStats struct{}

func (someStats) Stats() pyroscope.Stats {
	return pyroscope.Stats{RejectedBy: map[string]uint64{"InvalidArgument": 1}}
}

// TestReferenceIsWhatIsSent: a scrape with a sample of everything returns
// exactly the metrics of Reference, of their types, which docs/reference/metrics.md
// is generated from; a pedantic registry also checks each sample against
// what was described.
func TestReferenceIsWhatIsSent(t *testing.T) {
	var last LastInterval
	last.Set(&snapshot.Snapshot{Peaks: []snapshot.Peak{
		{PID: 7, Comm: "python3", GPU: "0", View: memory.ViewDriver, Amount: accounting.Amount{Bytes: 1}},
		{PID: 7, Comm: "python3", GPU: "0", View: memory.ViewTensor, Amount: accounting.Amount{Bytes: 1}},
	}, Breakdown: []snapshot.Breakdown{{PID: 7, Comm: "python3", GPU: "0", Parts: []snapshot.Part{{Category: snapshot.Parameters, Bytes: 1}}}},
		Growing:    []snapshot.Growing{{Key: accounting.Key{PID: 7, Stack: 1, Kind: memory.KindDevice}, Comm: "python3", BytesPerSecond: 1}},
		Exhaustion: []snapshot.Exhaustion{{GPU: 0, UUID: "GPU-0", Seconds: 1, Processes: []snapshot.ExhaustionShare{{PID: 7, Comm: "python3", Share: 1}}}},
	})
	registry := prometheus.NewPedanticRegistry()
	registry.MustRegister(Collector{Source: everyTotal{}, Peaks: &last, Breakdown: &last, Growth: &last, GPUObservability: true},
		PushCollector{Source: someStats{}})
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sent := map[string]dto.MetricType{}
	for _, f := range families {
		sent[f.GetName()] = f.GetType()
	}
	books, pushes := Reference()
	listed := map[string]dto.MetricType{}
	for _, m := range slices.Concat(books, pushes) {
		listed[m.Name] = *m.Type.ToDTO()
	}
	if !maps.Equal(sent, listed) {
		t.Errorf("sent %v\nlisted in Reference %v", sent, listed)
	}
}
