package profiledata

import (
	"sync"

	"github.com/inspektor-gadget/inspektor-gadget/pkg/datasource"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/operators"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/operators/simple"

	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// Last is an IG data operator that keeps the latest books a gadget
// emitted: its rows and the totals sent just before them (gpumem run's
// report, written once the gadget stops).
type Last struct {
	mu     sync.Mutex
	report *snapshot.Snapshot
	stats  snapshot.Snapshot // totals only
	seen   bool
}

// Operator is the data operator, subscribing at priority.
func (l *Last) Operator(priority int) operators.DataOperator {
	return simple.New("gpumem-output", simple.WithPriority(priority),
		simple.OnInit(func(gadgetCtx operators.GadgetContext) error {
			for _, ds := range gadgetCtx.GetDataSources() {
				var err error
				switch {
				case ds.Annotations()[schema.Annotation] == "true":
					err = l.subscribeRows(ds, priority)
				case ds.Annotations()[schema.StatsAnnotation] == "true":
					err = l.subscribeStats(ds, priority)
				}
				if err != nil {
					return err
				}
			}
			return nil
		}))
}

func (l *Last) subscribeRows(ds datasource.DataSource, priority int) error {
	return SubscribeSnapshots(ds, priority, func(r *snapshot.Snapshot) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		r.Events, r.Losses, r.Ledger, r.Libraries = l.stats.Events, l.stats.Losses, l.stats.Ledger, l.stats.Libraries
		l.report, l.seen = r, true
		return nil
	})
}

func (l *Last) subscribeStats(ds datasource.DataSource, priority int) error {
	stats, err := NewStatsReader(ds)
	if err != nil {
		return err
	}
	return ds.Subscribe(func(ds datasource.DataSource, d datasource.Data) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		return stats.Read(d, &l.stats)
	}, priority)
}

// Get is the latest books, false when the gadget emitted none.
func (l *Last) Get() (*snapshot.Snapshot, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.report, l.seen
}
