// Package controltest has tests wait on the tensor views an agent (through
// its control socket) or a profiler holds: the views' state, not the lines
// the agent logs about them.
package controltest

import (
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/control"
	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// Views are the tensor views something holds: an agent's, read through
// Agent, or a profiler's, its TensorViews.
type Views func() ([]snapshot.TensorView, error)

// Agent reads the views of the agent serving the control socket at path.
func Agent(path string) Views { return control.Dial(path).TensorViews }

// WaitView waits until pid has a view that ok accepts, and returns it; if
// none does within limit, it fails t with what and the last views read.
func WaitView(t testing.TB, views Views, pid int, what string, limit time.Duration, ok func(snapshot.TensorView) bool) snapshot.TensorView {
	t.Helper()
	var found snapshot.TensorView
	waitfor.Value(t, what, limit, func() []snapshot.TensorView {
		vs, err := views()
		if err != nil {
			t.Fatalf("tensor views: %v", err)
		}
		return vs
	}, func(vs []snapshot.TensorView) bool {
		for _, v := range vs {
			if int(v.PID) == pid && ok(v) {
				found = v
				return true
			}
		}
		return false
	})
	return found
}
