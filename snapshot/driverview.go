package snapshot

import (
	"fmt"
	"time"
)

// DriverViewOff is a process's driver view switched off by its budget
// (profiler.Config.DriverBudget): from Ended on, its driver calls are
// counted, not traced, and what the view held then was released
// implicitly, so the process's driver rows are partial.
type DriverViewOff struct {
	PID   uint32    `json:"pid"`
	Ended time.Time `json:"ended"`
	Why   string    `json:"why"`
	// Calls are the driver calls made since, not traced (while the
	// process runs).
	Calls uint64 `json:"calls_not_traced"`
}

// String says since when the view is off and why, in one line, for the
// outputs.
func (v DriverViewOff) String() string {
	return fmt.Sprintf("driver view of pid %d: off since %s: %s; %d driver calls not traced since (partial)",
		v.PID, v.Ended.Format(time.RFC3339Nano), v.Why, v.Calls)
}
