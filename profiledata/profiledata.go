// Package profiledata carries gpu-mem reports through Inspektor Gadget data
// sources, in the shape package schema names: a Writer turns a
// *snapshot.Snapshot into an array of rows, a Reader turns rows back into
// profiler rows. Operators on either side of IG's runtime share it.
package profiledata

import (
	"fmt"
	"strconv"
	"time"

	"github.com/inspektor-gadget/inspektor-gadget/pkg/datasource"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-service/api"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// fields are the row fields every profile data source has, with their kinds.
var fields = []struct {
	name string
	kind api.Kind
}{
	{schema.PID, api.Kind_Uint32}, {schema.Comm, api.Kind_String}, {schema.Kind, api.Kind_String},
	{schema.GPU, api.Kind_String}, {schema.PodUID, api.Kind_String}, {schema.ContainerID, api.Kind_String},
	{schema.Stack, api.Kind_String}, {schema.AllocBytes, api.Kind_Uint64}, {schema.AllocCount, api.Kind_Uint64},
	{schema.LiveBytes, api.Kind_Uint64}, {schema.LiveCount, api.Kind_Uint64},
}

// names are the optional fields operators/k8smeta adds.
var names = []string{schema.Namespace, schema.Pod, schema.Container, schema.Workload}

// Writer fills a profile data source.
type Writer struct {
	ds     datasource.DataSource
	fields map[string]datasource.FieldAccessor
}

// NewWriter adds the row fields and the schema annotation to ds.
func NewWriter(ds datasource.DataSource) (*Writer, error) {
	w := &Writer{ds: ds, fields: map[string]datasource.FieldAccessor{}}
	ds.AddAnnotation(schema.Annotation, "true")
	for _, f := range fields {
		acc, err := ds.AddField(f.name, f.kind)
		if err != nil {
			return nil, fmt.Errorf("data source %s: add %s: %w", ds.Name(), f.name, err)
		}
		w.fields[f.name] = acc
	}
	return w, nil
}

// Emit sends the rows of r as one array.
func (w *Writer) Emit(r *snapshot.Snapshot) error {
	arr, err := w.ds.NewPacketArray()
	if err != nil {
		return err
	}
	r.EachRow(func(row *snapshot.Row) {
		if err != nil {
			return
		}
		d := arr.New()
		if err = w.put(d, row); err == nil {
			arr.Append(d)
		}
	})
	if err != nil {
		w.ds.Release(arr)
		return err
	}
	return w.ds.EmitAndRelease(arr)
}

func (w *Writer) put(d datasource.Data, row *snapshot.Row) error {
	frames := make([]string, len(row.Frames))
	for i, f := range row.Frames {
		frames[len(frames)-1-i] = f.Name()
	}
	errs := []error{w.fields[schema.PID].PutUint32(d, row.PID)}
	for name, v := range map[string]string{
		schema.Comm: row.Comm, schema.Kind: row.Kind.String(), schema.GPU: row.GPU(),
		schema.PodUID: row.Container.PodUID, schema.ContainerID: row.Container.ContainerID,
		schema.Stack: schema.JoinFolded(frames),
	} {
		errs = append(errs, w.fields[name].PutString(d, v))
	}
	for name, v := range map[string]uint64{
		schema.AllocBytes: row.AllocBytes, schema.AllocCount: row.AllocCount,
		schema.LiveBytes: row.LiveBytes(), schema.LiveCount: row.LiveCount(),
	} {
		errs = append(errs, w.fields[name].PutUint64(d, v))
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Reader reads rows of a profile data source. It gives each (process,
// stack) a stable StackID and frames, so that consecutive arrays can be
// compared and a sink's encoding of a stack kept between them; a stack
// missing from an array is forgotten.
type Reader struct {
	fields map[string]datasource.FieldAccessor
	stacks map[string]*stack
	nextID accounting.StackID
	array  uint64 // arrays read
}

type stack struct {
	id     accounting.StackID
	frames []*symbolize.Frame // innermost first
	array  uint64             // the last array with the stack
}

// NewReader finds the row fields of ds, and the name fields when present.
func NewReader(ds datasource.DataSource) (*Reader, error) {
	r := &Reader{fields: map[string]datasource.FieldAccessor{}, stacks: map[string]*stack{}}
	for _, f := range fields {
		if r.fields[f.name] = ds.GetField(f.name); r.fields[f.name] == nil {
			return nil, fmt.Errorf("data source %s: no field %q", ds.Name(), f.name)
		}
	}
	for _, name := range names {
		if acc := ds.GetField(name); acc != nil {
			r.fields[name] = acc
		}
	}
	return r, nil
}

// SubscribeSnapshots calls f with each array of the profile data source ds,
// read as a snapshot stamped with the time it arrived.
func SubscribeSnapshots(ds datasource.DataSource, priority int, f func(*snapshot.Snapshot) error) error {
	rows, err := NewReader(ds)
	if err != nil {
		return err
	}
	return ds.SubscribeArray(func(ds datasource.DataSource, arr datasource.DataArray) error {
		r, err := rows.Snapshot(arr)
		if err != nil {
			return fmt.Errorf("data source %s: %w", ds.Name(), err)
		}
		r.Time = time.Now()
		return f(r)
	}, priority)
}

// Snapshot reads one array. Its frames carry function names only.
func (r *Reader) Snapshot(arr datasource.DataArray) (*snapshot.Snapshot, error) {
	r.array++
	rep := &snapshot.Snapshot{}
	for n := range arr.Len() {
		row, err := r.Row(arr.Get(n))
		if err != nil {
			return rep, err
		}
		rep.Add(row)
	}
	for key, s := range r.stacks {
		if s.array != r.array {
			delete(r.stacks, key) // its process was dropped
		}
	}
	return rep, nil
}

// Row reads one row; frees are what was allocated and is not live.
func (r *Reader) Row(d datasource.Data) (snapshot.Row, error) {
	var row snapshot.Row
	var err error
	text := func(name string) string {
		s, e := r.fields[name].String(d)
		err = firstErr(err, e)
		return s
	}
	number := func(name string) uint64 {
		v, e := r.fields[name].Uint64(d)
		err = firstErr(err, e)
		return v
	}
	pid, e := r.fields[schema.PID].Uint32(d)
	err = firstErr(err, e)
	kind, ok := memory.ParseKind(text(schema.Kind))
	if !ok {
		err = firstErr(err, fmt.Errorf("unknown kind"))
	}
	device, convErr := strconv.Atoi(text(schema.GPU))
	switch {
	case text(schema.GPU) == memory.GPUHost:
		device = memory.DeviceHost // GPU names host memory so whatever its kind
	case convErr != nil:
		device = memory.DeviceUnknown
	}
	st := r.stack(pid, text(schema.Stack))
	row.Frames = st.frames
	row.Key = accounting.Key{PID: pid, Stack: st.id, Kind: kind, Device: int32(device)}
	row.Comm = text(schema.Comm)
	row.Container = container.Identity{PodUID: text(schema.PodUID), ContainerID: text(schema.ContainerID)}
	if r.fields[schema.Namespace] != nil {
		row.Container.Namespace, row.Container.Pod = text(schema.Namespace), text(schema.Pod)
		row.Container.Name, row.Container.Workload = text(schema.Container), text(schema.Workload)
	}
	row.AllocBytes, row.AllocCount = number(schema.AllocBytes), number(schema.AllocCount)
	row.FreeBytes = row.AllocBytes - number(schema.LiveBytes)
	row.FreeCount = row.AllocCount - number(schema.LiveCount)
	return row, err
}

// stack is a process's stack, made when first read.
func (r *Reader) stack(pid uint32, folded string) *stack {
	key := strconv.FormatUint(uint64(pid), 10) + "\x00" + folded
	s := r.stacks[key]
	if s == nil {
		r.nextID++
		s = &stack{id: r.nextID}
		names := schema.SplitFolded(folded)
		for n := len(names) - 1; n >= 0; n-- {
			s.frames = append(s.frames, &symbolize.Frame{Function: names[n]})
		}
		r.stacks[key] = s
	}
	s.array = r.array
	return s
}

func firstErr(first, next error) error {
	if first != nil {
		return first
	}
	return next
}
