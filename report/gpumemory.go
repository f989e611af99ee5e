package report

import (
	"fmt"
	"io"

	"github.com/gpu-mem/gpu-mem/snapshot"
)

// writeGPUMemory writes what NVML says each GPU holds, each process's
// number parted into what was traced and the rest; nothing without NVML
// (said once, when the profiler started).
func writeGPUMemory(w io.Writer, m *snapshot.GPUMemory) {
	if m == nil {
		return
	}
	for _, g := range m.GPUs {
		fmt.Fprintf(w, "GPU %d (%s): %s used of %s (nvidia-smi)\n", g.Index, g.UUID, HumanBytes(g.Used), HumanBytes(g.Total))
		for _, p := range g.Processes {
			if !p.Traced {
				fmt.Fprintf(w, "  pid %d (%s): %s, not traced\n", p.PID, Printable(p.Comm), HumanBytes(p.NVML))
				continue
			}
			fmt.Fprintf(w, "  pid %d (%s), gpu %s: %s = %s traced + %s in contexts seen made + %s in modules seen loaded %s kernel images and driver internals\n",
				p.PID, Printable(p.Comm), p.GPU, HumanBytes(p.NVML), HumanBytes(p.Driver), HumanBytes(p.Contexts), HumanBytes(p.Modules),
				signedTerm(p.DriverInternal))
		}
		if g.NotOfProcesses > 0 {
			fmt.Fprintf(w, "  of no process: %s\n", HumanBytes(g.NotOfProcesses))
		}
	}
}

// signedTerm is n as a term of a sum: "+ 1.0 MiB", "- 1.0 MiB".
func signedTerm(n int64) string {
	if n < 0 {
		return "- " + HumanBytes(uint64(-n))
	}
	return "+ " + HumanBytes(uint64(n))
}

// jsonGPU is one GPU as NVML reports it, its processes' memory reconciled.
type jsonGPU struct {
	Index          int              `json:"index"`
	UUID           string           `json:"uuid"`
	TotalBytes     uint64           `json:"total_bytes"`
	ReservedBytes  uint64           `json:"reserved_bytes"`
	UsedBytes      uint64           `json:"used_bytes"` // nvidia-smi's memory.used
	NotOfProcesses uint64           `json:"not_of_processes_bytes"`
	Processes      []jsonGPUProcess `json:"processes"`
}

// jsonGPUProcess is one process's memory on one GPU: nvidia-smi's number,
// what was traced (traced processes only) and the rest.
type jsonGPUProcess struct {
	PID         uint32 `json:"pid"`
	Comm        string `json:"comm"`
	GPU         string `json:"gpu"` // as the process's stacks name it
	NVMLBytes   uint64 `json:"nvml_bytes"`
	Traced      bool   `json:"traced"`
	DriverBytes uint64 `json:"driver_bytes"`
	// the contexts gpu-mem saw it make, each NVML's growth across its creation
	ContextBytes uint64 `json:"context_bytes"`
	// the modules and libraries it loaded and did not unload, each NVML's
	// growth across its load (eager loading only: lazily loaded kernel
	// images are in driver_internal_bytes)
	ModuleBytes uint64 `json:"module_bytes"`
	// kernel images and driver internals: nvml_bytes - driver_bytes - context_bytes - module_bytes
	DriverInternalBytes int64 `json:"driver_internal_bytes"`
}

// newJSONGPUs is m's GPUs; nil (unknown) without NVML.
func newJSONGPUs(m *snapshot.GPUMemory) []jsonGPU {
	if m == nil {
		return nil
	}
	gpus := make([]jsonGPU, 0, len(m.GPUs))
	for _, g := range m.GPUs {
		j := jsonGPU{Index: g.Index, UUID: g.UUID, TotalBytes: g.Total, ReservedBytes: g.Reserved, UsedBytes: g.Used,
			NotOfProcesses: g.NotOfProcesses, Processes: []jsonGPUProcess{}}
		for _, p := range g.Processes {
			j.Processes = append(j.Processes, jsonGPUProcess{PID: p.PID, Comm: p.Comm, GPU: p.GPU, NVMLBytes: p.NVML,
				Traced: p.Traced, DriverBytes: p.Driver, ContextBytes: p.Contexts, ModuleBytes: p.Modules, DriverInternalBytes: p.DriverInternal})
		}
		gpus = append(gpus, j)
	}
	return gpus
}
