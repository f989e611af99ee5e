package snapshot

import (
	"testing"
	"time"
)

// TestTensorViewString says from when a view holds and how it ended.
func TestTensorViewString(t *testing.T) {
	since := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		v    TensorView
		want string
	}{
		{TensorView{PID: 3, By: ByControl}, "tensor view of pid 3 (by control): waiting for PyTorch's allocator"},
		{TensorView{PID: 3, By: ByAnnotation, Since: since, Until: since.Add(time.Hour)},
			"tensor view of pid 3 (by pod annotation): since 2026-12-01T10:00:00Z; tensors made before are charged to no one, until 2026-12-01T11:00:00Z"},
		{TensorView{PID: 3, By: ByFlag, Since: since, Ended: since.Add(time.Minute), Why: "over budget: x", OverBudget: true},
			"tensor view of pid 3 (by flag): since 2026-12-01T10:00:00Z; tensors made before are charged to no one; ended 2026-12-01T10:01:00Z: over budget: x (partial)"},
	} {
		if got := c.v.String(); got != c.want {
			t.Errorf("got  %s\nwant %s", got, c.want)
		}
	}
}

// TestParseBudget: a share or a percentage, from 0 to 1, read exactly;
// anything else refused.
func TestParseBudget(t *testing.T) {
	for in, want := range map[string]float64{"0.25": 0.25, "25%": 0.25, " 2% ": 0.02, "0": 0, "1": 1, "100%": 1} {
		if got, err := ParseBudget(in); err != nil || got != want {
			t.Errorf("ParseBudget(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "-0.1", "1.5", "150%", "NaN", "5%%"} {
		if got, err := ParseBudget(in); err == nil {
			t.Errorf("ParseBudget(%q) = %v, want an error", in, got)
		}
	}
}
