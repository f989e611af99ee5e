// The counters the BPF side keeps: losses, calls in flight, the tensor
// probes' runs.

package tracer

import (
	"fmt"
	"time"

	"github.com/cilium/ebpf"

	"github.com/gpu-mem/gpu-mem/schema"
)

// TensorProbeStats are how often the tensor probes' program ran and for how
// long, in every process it is attached for: the run time is counted while
// kernel.bpf_stats_enabled is set (ebpf.EnableStats).
func (t *Tracer) TensorProbeStats() (runs uint64, runtime time.Duration, err error) {
	s, err := t.objs.GpumemTensor.Stats()
	if err != nil {
		return 0, 0, fmt.Errorf("tensor probes' stats: %w", err)
	}
	return s.RunCount, s.Runtime, nil
}

// InFlight counts the driver calls entered and not yet returned.
func (t *Tracer) InFlight() (int, error) {
	var (
		n     int
		key   uint64
		value gpumemGpumemCalls
	)
	it := t.objs.Inflight.Iterate()
	for it.Next(&key, &value) {
		n += int(value.Depth)
	}
	return n, it.Err()
}

// bpfLosses are the BPF loss counters gpumem's programs keep, by the
// reason each counts. The others count for stock IG's programs only.
var bpfLosses = map[gpumemGpumemLoss]schema.Loss{
	gpumemGpumemLossGPUMEM_LOSS_INFLIGHT_FULL:   schema.InflightFull,
	gpumemGpumemLossGPUMEM_LOSS_NESTED_TOO_DEEP: schema.NestedTooDeep,
	gpumemGpumemLossGPUMEM_LOSS_READ_RESULT:     schema.ResultUnreadable,
	gpumemGpumemLossGPUMEM_LOSS_PROCESSES_FULL:  schema.ProcessesFull,
	gpumemGpumemLossGPUMEM_LOSS_SCRATCH_BUSY:    schema.ScratchBusy,
	gpumemGpumemLossGPUMEM_LOSS_CONTEXTS_FULL:   schema.ContextsFull,
	gpumemGpumemLossGPUMEM_LOSS_TENSOR_ARG:      schema.TensorArgUnreadable,
	gpumemGpumemLossGPUMEM_LOSS_ALLOCATOR_CALL:  schema.AllocatorCallIncomplete,
}

// Losses reads the loss counters: everything the BPF side could not
// deliver whole.
func (t *Tracer) Losses() (schema.Losses, error) {
	var l schema.Losses
	var err error
	if l[schema.RingBufferFull], err = sumPerCPU(t.objs.EventsLostSamples, 0); err != nil {
		return l, err
	}
	for key, loss := range bpfLosses {
		if l[loss], err = sumPerCPU(t.objs.Losses, uint32(key)); err != nil {
			return l, err
		}
	}
	return l, nil
}

// LostBytes sums the bytes of the driver's allocations whose events the
// ring buffer could not take (schema.RingBufferFull): never charged.
func (t *Tracer) LostBytes() (uint64, error) { return sumPerCPU(t.objs.EventsLostBytes, 0) }

func sumPerCPU(m *ebpf.Map, key uint32) (uint64, error) {
	var values []uint64
	if err := m.Lookup(key, &values); err != nil {
		return 0, fmt.Errorf("read %s[%d]: %w", m, key, err)
	}
	var sum uint64
	for _, v := range values {
		sum += v
	}
	return sum, nil
}
