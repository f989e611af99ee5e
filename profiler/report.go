package profiler

import (
	"slices"

	"github.com/gpu-mem/gpu-mem/accounting"
)

// onGPU says whether a row is on the devices the report is limited to.
func (p *Profiler) onGPU(k accounting.Key) bool {
	if len(p.cfg.GPUs) == 0 {
		return true
	}
	return k.Kind.OnDevice() && slices.Contains(p.cfg.GPUs, int(k.Device))
}
