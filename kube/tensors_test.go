package kube

import (
	"testing"
	"time"
)

// TestTensorsAsked: a pod's annotations read into its ask for the tensor
// view, exactly, and annotations that ask in words that cannot be read
// named in the error.
func TestTensorsAsked(t *testing.T) {
	until := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		annotations map[string]string
		on          bool
		until       time.Time
		budget      float64 // -1: none given
		err         string
	}{
		{annotations: nil, budget: -1},
		{annotations: map[string]string{TensorsAnnotation: "false", TensorsBudgetAnnotation: "lots"}, budget: -1},
		{annotations: map[string]string{TensorsAnnotation: "true"}, on: true, budget: -1},
		{annotations: map[string]string{TensorsAnnotation: "True", TensorsUntilAnnotation: "2026-12-02T10:00:00Z"}, on: true, until: until, budget: -1},
		{annotations: map[string]string{TensorsAnnotation: "true", TensorsBudgetAnnotation: "25%"}, on: true, budget: 0.25},
		{annotations: map[string]string{TensorsAnnotation: "true", TensorsBudgetAnnotation: "0.5"}, on: true, budget: 0.5},
		{annotations: map[string]string{TensorsAnnotation: "true", TensorsBudgetAnnotation: "0"}, on: true, budget: 0},
		{annotations: map[string]string{TensorsAnnotation: "yes"}, on: true, budget: -1,
			err: `gpu-mem.io/tensors: want true or false, got "yes"`},
		{annotations: map[string]string{TensorsAnnotation: "true", TensorsUntilAnnotation: "2026-12-02 10:00"}, on: true, budget: -1,
			err: `gpu-mem.io/tensors-until: want an RFC 3339 time (2026-12-02T10:00:00Z), got "2026-12-02 10:00"`},
		{annotations: map[string]string{TensorsAnnotation: "true", TensorsBudgetAnnotation: "150%"}, on: true, budget: -1,
			err: `gpu-mem.io/tensors-budget: want a share of the process's time from 0 (no budget) to 1, or a percentage, got "150%"`},
	} {
		on, ask, err := tensorsAsked(c.annotations)
		budget := -1.0
		if ask.Budget != nil {
			budget = *ask.Budget
		}
		gotErr := ""
		if err != nil {
			gotErr = err.Error()
		}
		if on != c.on || !ask.Until.Equal(c.until) || budget != c.budget || gotErr != c.err || ask.By != "" {
			t.Errorf("%v: on %v, %+v (budget %v), error %q; want on %v, until %v, budget %v, error %q",
				c.annotations, on, ask, budget, gotErr, c.on, c.until, c.budget, c.err)
		}
	}
}
