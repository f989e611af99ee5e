// Switching a process's driver view off, over its budget.

package tracer

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// SwitchDriverOff stops tracing process pid's driver calls: they are
// counted (DriverCallsOff) and not reported, whether entered before or
// after, until the process exits. Events sent before are still to be read.
func (t *Tracer) SwitchDriverOff(pid uint32) error {
	if err := t.objs.DriverOff.Update(pid, uint64(0), ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("switch pid %d's driver view off: %w", pid, err)
	}
	return nil
}

// DriverCallsOff counts process pid's driver calls not traced since its
// driver view was switched off; false when it is not off (or exited).
func (t *Tracer) DriverCallsOff(pid uint32) (uint64, bool) {
	var n uint64
	if err := t.objs.DriverOff.Lookup(pid, &n); err != nil {
		return 0, false
	}
	return n, true
}
