package snapshot

import "time"

// GPUMemory is what NVML (nvidia-smi) says the GPUs hold, each process's
// part reconciled with what gpu-mem traced: nil where NVML cannot be read,
// the parts beyond the traced memory then unknown.
type GPUMemory struct {
	Time time.Time // when NVML was read
	GPUs []GPU
}

// GPU is one GPU as NVML reports it.
type GPU struct {
	Index int    // NVML's index (nvidia-smi's), in PCI bus order
	UUID  string // "GPU-..."
	Total uint64
	// Reserved is set aside by the driver: in no process, not in Used.
	Reserved uint64
	// Used is nvidia-smi's memory.used; what its processes use, and
	// NotOfProcesses.
	Used           uint64
	NotOfProcesses uint64
	Processes      []ProcessMemory // by PID
}

// ProcessMemory is one process's memory on one GPU: what NVML says it uses
// (nvidia-smi --query-compute-apps=pid,used_memory), which is what gpu-mem
// traced there (its driver view, at the moment NVML was read) and the
// rest, named.
type ProcessMemory struct {
	PID  uint32
	Comm string
	// GPU is the GPU as the process's rows name it (its CUDA ordinal, or
	// NVML's index for a process gpu-mem does not trace).
	GPU  string
	NVML uint64
	// Traced says whether gpu-mem traces the process; if not, all of NVML
	// is the process's, unexplained.
	Traced bool
	Driver uint64 // traced: its driver view's live bytes on the GPU
	// Contexts are the CUDA contexts gpu-mem saw the process make on the
	// GPU: each NVML's growth across its creation.
	Contexts uint64
	// Modules are the kernel images of the modules and libraries gpu-mem
	// saw the process load there and not unload: each NVML's growth
	// across its load (nothing under lazy loading, the default).
	Modules uint64
	// DriverInternal is NVML less Driver, Contexts and Modules: kernel
	// images loaded lazily (at a kernel's first launch), the driver's
	// internal buffers, contexts made before gpu-mem attached. Negative
	// where gpu-mem counted more than NVML did (memory NVML had not seen
	// yet).
	DriverInternal int64
}

// Of is what NVML says process pid uses on the GPU its rows name gpu, and
// that GPU; nil if NVML says nothing of it. Rows that name no GPU
// ("unknown": the context was made before gpu-mem attached) are on the
// GPU NVML lists the process on, if it lists it on one only.
func (m *GPUMemory) Of(pid uint32, gpu string) (*ProcessMemory, *GPU) {
	if m == nil {
		return nil, nil
	}
	var found *ProcessMemory
	var on *GPU
	n := 0
	for i := range m.GPUs {
		for j := range m.GPUs[i].Processes {
			if p := &m.GPUs[i].Processes[j]; p.PID == pid {
				if p.GPU == gpu {
					return p, &m.GPUs[i]
				}
				found, on = p, &m.GPUs[i]
				n++
			}
		}
	}
	if gpu == "unknown" && n == 1 {
		return found, on
	}
	return nil, nil
}

// Comm is the name of a process the GPUs hold memory of; empty if none.
func (m *GPUMemory) Comm(pid uint32) string {
	if m == nil {
		return ""
	}
	for _, g := range m.GPUs {
		for _, p := range g.Processes {
			if p.PID == pid {
				return p.Comm
			}
		}
	}
	return ""
}
