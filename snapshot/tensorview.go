package snapshot

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Who switched a tensor view on.
const (
	ByFlag       = "flag"
	ByControl    = "control"
	ByAnnotation = "pod annotation"
)

// TensorAsk asks for a process's tensor view: who asks, until when, and
// how much of its process's time the view may cost.
type TensorAsk struct {
	By     string    // ByFlag, ByControl, ByAnnotation
	Until  time.Time // zero: until switched off
	Budget *float64  // the share of its process's time; nil: the agent's (--tensor-budget); 0: none
}

// ParseBudget reads a TensorAsk's budget: a share of its process's time
// from 0 (no budget) to 1 ("0.25"), or a percentage ("25%").
func ParseBudget(s string) (float64, error) {
	number, percent := strings.CutSuffix(strings.TrimSpace(s), "%")
	share, err := strconv.ParseFloat(number, 64)
	if percent {
		share /= 100
	}
	if err != nil || !(share >= 0 && share <= 1) {
		return 0, fmt.Errorf("want a share of the process's time from 0 (no budget) to 1, or a percentage, got %q", s)
	}
	return share, nil
}

// TensorView is one process's tensor view switched on on demand: from when
// it holds, until when, and, once ended, when and why. Tensors made before
// Since are charged to no one and their frees are counted apart
// (accounting.Stats.FreesBeforeView); what the view held when it ended is
// released implicitly.
type TensorView struct {
	PID        uint32    `json:"pid"`
	By         string    `json:"by"`                    // ByFlag, ByControl, ByAnnotation
	Asked      time.Time `json:"asked"`                 // when it was switched on
	Since      time.Time `json:"since,omitzero"`        // when its probes were attached; zero: its allocator not loaded yet
	Until      time.Time `json:"until,omitzero"`        // when it is to end; zero: when switched off
	Ended      time.Time `json:"ended,omitzero"`        // when it ended
	Why        string    `json:"why,omitempty"`         // why it ended
	OverBudget bool      `json:"over_budget,omitempty"` // ended by the budget: the view is partial
	Budget     float64   `json:"budget"`                // the share of its process's time it may cost; 0: no budget
}

// String says from when the view holds, in one line, for the outputs.
func (v TensorView) String() string {
	s := fmt.Sprintf("tensor view of pid %d (by %s): ", v.PID, v.By)
	if v.Since.IsZero() {
		s += "waiting for PyTorch's allocator"
	} else {
		s += "since " + v.Since.Format(time.RFC3339Nano) + "; tensors made before are charged to no one"
	}
	if !v.Until.IsZero() && v.Ended.IsZero() {
		s += ", until " + v.Until.Format(time.RFC3339)
	}
	if !v.Ended.IsZero() {
		s += "; ended " + v.Ended.Format(time.RFC3339Nano) + ": " + v.Why
	}
	if v.OverBudget {
		s += " (partial)"
	}
	return s
}
