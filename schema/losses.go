package schema

import (
	"encoding/json"
	"fmt"
)

// Loss is a reason why the BPF side could not deliver an event whole. Its
// name is the same in every output: the JSON report, the stats data
// source, the metrics' reason label and the docs.
type Loss int

const (
	RingBufferFull          Loss = iota // events dropped: the ring buffer was full
	InflightFull                        // calls not tracked: the in-flight map was full
	NestedTooDeep                       // calls not tracked: traced calls nested deeper than the in-flight stack
	ResultUnreadable                    // allocations whose out-parameter could not be read
	ProcessesFull                       // process exits that will not be reported
	ScratchBusy                         // events dropped: a probe ran while another held the CPU's scratch event
	ContextsFull                        // context changes not kept: the thread or context map was full (device unknown after)
	TensorArgUnreadable                 // tensor events dropped: a USDT argument could not be read
	AllocatorCallIncomplete             // calls of the allocator's own functions (a checkpoint restore, raw_alloc) not followed whole
	NumLosses                           // the number of reasons
)

var lossNames = [NumLosses]string{
	RingBufferFull:          "ring_buffer_full",
	InflightFull:            "inflight_full",
	NestedTooDeep:           "nested_too_deep",
	ResultUnreadable:        "result_unreadable",
	ProcessesFull:           "processes_full",
	ScratchBusy:             "scratch_busy",
	ContextsFull:            "contexts_full",
	TensorArgUnreadable:     "tensor_arg_unreadable",
	AllocatorCallIncomplete: "allocator_call_incomplete",
}

func (l Loss) String() string {
	if l < 0 || l >= NumLosses {
		return fmt.Sprintf("loss(%d)", int(l))
	}
	return lossNames[l]
}

// Losses count each reason.
type Losses [NumLosses]uint64

// Total is the sum of all losses.
func (l Losses) Total() uint64 {
	var sum uint64
	for _, n := range l {
		sum += n
	}
	return sum
}

// MarshalJSON writes an object with every reason by name, in order.
func (l Losses) MarshalJSON() ([]byte, error) {
	b := []byte{'{'}
	for i, n := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, "%q:%d", Loss(i), n)
	}
	return append(b, '}'), nil
}

// UnmarshalJSON reads what MarshalJSON writes; a reason it does not know
// is an error, so that a report of a newer gpu-mem is not read as lossless.
func (l *Losses) UnmarshalJSON(data []byte) error {
	var byName map[string]uint64
	if err := json.Unmarshal(data, &byName); err != nil {
		return err
	}
	*l = Losses{}
next:
	for name, n := range byName {
		for i, known := range lossNames {
			if name == known {
				l[i] = n
				continue next
			}
		}
		return fmt.Errorf("unknown loss %q", name)
	}
	return nil
}
