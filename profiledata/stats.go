package profiledata

import (
	"fmt"
	"strings"

	"github.com/inspektor-gadget/inspektor-gadget/pkg/datasource"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-service/api"

	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

type counter struct {
	name  string
	field func(*snapshot.Snapshot) *uint64
}

// counters are the stats fields, each a number of the report.
var counters = statsCounters()

func statsCounters() []counter {
	c := []counter{
		{schema.Events, func(r *snapshot.Snapshot) *uint64 { return &r.Events }},
		{schema.UnknownFrees, func(r *snapshot.Snapshot) *uint64 { return &r.Ledger.UnknownFrees }},
		{schema.ProcessExits, func(r *snapshot.Snapshot) *uint64 { return &r.Ledger.ProcessExits }},
	}
	for l := range schema.NumLosses {
		c = append(c, counter{l.String(), func(r *snapshot.Snapshot) *uint64 { return &r.Losses[l] }})
	}
	return c
}

// StatsWriter fills a stats data source (schema.StatsAnnotation).
type StatsWriter struct {
	ds        datasource.DataSource
	counters  []datasource.FieldAccessor
	libraries datasource.FieldAccessor
}

// NewStatsWriter adds the stats fields and annotation to ds.
func NewStatsWriter(ds datasource.DataSource) (*StatsWriter, error) {
	w := &StatsWriter{ds: ds}
	ds.AddAnnotation(schema.StatsAnnotation, "true")
	for _, c := range counters {
		acc, err := ds.AddField(c.name, api.Kind_Uint64)
		if err != nil {
			return nil, fmt.Errorf("data source %s: add %s: %w", ds.Name(), c.name, err)
		}
		w.counters = append(w.counters, acc)
	}
	var err error
	if w.libraries, err = ds.AddField(schema.Libraries, api.Kind_String); err != nil {
		return nil, fmt.Errorf("data source %s: add %s: %w", ds.Name(), schema.Libraries, err)
	}
	return w, nil
}

// Emit sends the totals of r.
func (w *StatsWriter) Emit(r *snapshot.Snapshot) error {
	d, err := w.ds.NewPacketSingle()
	if err != nil {
		return err
	}
	for i, c := range counters {
		if err := w.counters[i].PutUint64(d, *c.field(r)); err != nil {
			w.ds.Release(d)
			return err
		}
	}
	if err := w.libraries.PutString(d, strings.Join(r.Libraries, ",")); err != nil {
		w.ds.Release(d)
		return err
	}
	return w.ds.EmitAndRelease(d)
}

// StatsReader reads a stats data source.
type StatsReader struct {
	counters  []datasource.FieldAccessor
	libraries datasource.FieldAccessor
}

// NewStatsReader finds the stats fields of ds.
func NewStatsReader(ds datasource.DataSource) (*StatsReader, error) {
	r := &StatsReader{libraries: ds.GetField(schema.Libraries)}
	for _, c := range counters {
		acc := ds.GetField(c.name)
		if acc == nil {
			return nil, fmt.Errorf("data source %s: no field %q", ds.Name(), c.name)
		}
		r.counters = append(r.counters, acc)
	}
	if r.libraries == nil {
		return nil, fmt.Errorf("data source %s: no field %q", ds.Name(), schema.Libraries)
	}
	return r, nil
}

// Read sets the totals of rep from d.
func (r *StatsReader) Read(d datasource.Data, rep *snapshot.Snapshot) error {
	for i, c := range counters {
		v, err := r.counters[i].Uint64(d)
		if err != nil {
			return err
		}
		*c.field(rep) = v
	}
	libraries, err := r.libraries.String(d)
	if err != nil {
		return err
	}
	rep.Libraries = strings.Split(libraries, ",")
	if libraries == "" {
		rep.Libraries = nil
	}
	return nil
}
