// Package pprof builds pprof profiles of GPU memory, with the sample types
// of Go's heap profiles so that every pprof tool reads them as memory: the
// driver view under Go's names, the tensor view under its own (SampleTypes),
// and in each view the peak: each stack's share of its process's most memory
// at once on its GPU.
package pprof

import (
	"compress/gzip"
	"fmt"
	"io"
	"time"

	"github.com/google/pprof/profile"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// Values are a row's values, in the order of its view's sample types:
// alloc_objects, alloc_space, inuse_objects, inuse_space, peak_objects,
// peak_space.
type Values [6]int64

// Where Values and SampleTypes hold what: SampleTypes(v)[InuseSpace] is
// view v's live bytes.
const (
	AllocObjects = iota
	AllocSpace
	InuseObjects
	InuseSpace
	PeakObjects
	PeakSpace
)

// NewValues are the values of memory allocated, live and held at a peak.
func NewValues(alloc, live, peak accounting.Amount) Values {
	return Values{AllocObjects: int64(alloc.Count), AllocSpace: int64(alloc.Bytes), InuseObjects: int64(live.Count),
		InuseSpace: int64(live.Bytes), PeakObjects: int64(peak.Count), PeakSpace: int64(peak.Bytes)}
}

// PeakShares are each row's share of its process's peak (on its GPU, in
// its view): the rows of the peaks, by key. A row not in its peak has none.
func PeakShares(peaks []snapshot.Peak) map[accounting.Key]accounting.Amount {
	shares := map[accounting.Key]accounting.Amount{}
	for _, pk := range peaks {
		for _, s := range pk.Shares {
			shares[s.Key] = s.Amount
		}
	}
	return shares
}

// SampleTypes are a view's sample types, in the order of Values. The driver
// view has Go heap profiles' own, so that a pprof reader's default
// (inuse_space) is what the GPU holds, and peak_objects and peak_space:
// each stack's share of its process's most memory at once on its GPU
// (snapshot.Peak; the peaks of two processes, or of two GPUs, are reached
// at different moments, so their sum is no peak of both). The tensor view
// has the same names prefixed with "tensor_", so that it is never summed
// with the driver view and is read with -sample_index=tensor_inuse_space.
func SampleTypes(v memory.View) []*profile.ValueType {
	prefix := ""
	if v == memory.ViewTensor {
		prefix = "tensor_"
	}
	return []*profile.ValueType{
		AllocObjects: {Type: prefix + "alloc_objects", Unit: "count"},
		AllocSpace:   {Type: prefix + "alloc_space", Unit: "bytes"},
		InuseObjects: {Type: prefix + "inuse_objects", Unit: "count"},
		InuseSpace:   {Type: prefix + "inuse_space", Unit: "bytes"},
		PeakObjects:  {Type: prefix + "peak_objects", Unit: "count"},
		PeakSpace:    {Type: prefix + "peak_space", Unit: "bytes"},
	}
}

// Every profile's period type: memory, by the byte. Pyroscope names a
// profile type by it (name:sample type:unit:period type:period unit).
const (
	PeriodType = "space"
	PeriodUnit = "bytes"
)

// DefaultSampleType is the sample type a profile of view v opens with.
func DefaultSampleType(v memory.View) string { return SampleTypes(v)[InuseSpace].Type }

// PeakSampleType is the sample type of view v's peak bytes.
func PeakSampleType(v memory.View) string { return SampleTypes(v)[PeakSpace].Type }

// Write writes a profile of the report's rows, gzipped, one sample per
// (process, stack, memory kind, device) labelled with pid, comm, kind and
// gpu (and the pod and GPU where known), with both views' sample types;
// the peaks are the report's (every row of a peak is a row of the report:
// the same books at the same moment). Comments say how it was made
// (Comment).
func Write(w io.Writer, r *snapshot.Snapshot, comments ...string) error {
	e := NewEncoder(false, memory.Views...)
	shares := PeakShares(r.Peaks)
	r.EachRow(func(row *snapshot.Row) { e.Add(row, shares[row.Key]) })
	zw := gzip.NewWriter(w)
	if err := e.WriteTo(zw, r.Time, 0, comments...); err != nil {
		return err
	}
	return zw.Close()
}

// Comment returns the lines a profile carries about how it was made, and
// when each peak was reached.
func Comment(r *snapshot.Snapshot) []string {
	lines := []string{
		fmt.Sprintf("gpu-mem at %s", r.Time.Format(time.RFC3339)),
		fmt.Sprintf("losses: %d (ring buffer %d)", r.Losses.Total(), r.Losses[schema.RingBufferFull]),
		fmt.Sprintf("unknown frees: %d", r.Ledger.UnknownFrees),
		"views: inuse_space and alloc_space are the driver's (what the GPU holds), tensor_inuse_space and " +
			"tensor_alloc_space PyTorch's tensors, inside the driver's segments: never add them",
		"peaks: peak_space (tensor_peak_space) is each stack's share of its process's most memory at once on its GPU; " +
			"the peaks of two processes or GPUs came at different moments: their sum is no peak",
	}
	for _, v := range r.TensorViews {
		lines = append(lines, v.String())
	}
	for _, v := range r.DriverViewsOff {
		lines = append(lines, v.String())
	}
	for _, pk := range r.Peaks {
		lines = append(lines, fmt.Sprintf("peak of pid %d (%s) on gpu %s, %s view: %d bytes in %d allocations at %s",
			pk.PID, pk.Comm, pk.GPU, pk.View, pk.Bytes, pk.Count, pk.Time.Format(time.RFC3339Nano)))
	}
	return lines
}
