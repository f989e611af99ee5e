// Package nvml reads GPU memory as the NVIDIA driver's management library,
// libnvidia-ml.so.1, reports it: what nvidia-smi shows, per GPU and per
// process. It loads the library at run time without cgo (purego), so the
// agent's CGO_ENABLED=0 build reads it; that build is then linked
// dynamically against the C library (dlopen), though it needs no library
// of its own.
package nvml

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ebitengine/purego"
)

// Library is the name the dynamic loader finds the driver's library by.
const Library = "libnvidia-ml.so.1"

// NVML's return codes that this package tells apart.
const (
	success          = 0
	insufficientSize = 7
)

// notAvailable is the usedGpuMemory of a process whose usage NVML cannot
// tell (a process in another container without the rights, vGPU guests).
const notAvailable = ^uint64(0)

// memoryV2 is nvmlMemory_v2_t.
type memoryV2 struct {
	version  uint32
	total    uint64
	reserved uint64
	free     uint64
	used     uint64
}

// memoryV2Version is nvmlMemory_v2: the struct's size, version 2.
const memoryV2Version = uint32(40 | 2<<24)

// processInfo is nvmlProcessInfo_t of the _v3 calls (nvmlProcessInfo_v2_t).
type processInfo struct {
	pid               uint32
	usedGpuMemory     uint64
	gpuInstanceID     uint32
	computeInstanceID uint32
}

// Error is an NVML call that did not succeed.
type Error struct {
	Func string
	Code int32
	Text string // nvmlErrorString's
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s (%d)", e.Func, e.Text, e.Code) }

// NVML is the library, loaded and initialized: one goroutine reads it at a
// time (Read reuses its buffers).
type NVML struct {
	handle uintptr
	// The library's functions.
	init          func() int32
	shutdown      func() int32
	errorString   func(int32) string
	driverVersion func(*byte, uint32) int32
	count         func(*uint32) int32
	byIndex       func(uint32, *uintptr) int32
	uuid          func(uintptr, *byte, uint32) int32
	memoryInfo    func(uintptr, *memoryV2) int32
	processes     func(uintptr, *uint32, *processInfo) int32

	devices []device
	infos   []processInfo // the process list's buffer, grown as needed
	// DriverVersion is the driver's, as NVML says it.
	DriverVersion string
}

type device struct {
	handle uintptr
	index  int
	uuid   string
}

// GPU is one GPU's memory at a sample.
type GPU struct {
	Index    int    // NVML's index, in PCI bus order
	UUID     string // "GPU-..."
	Total    uint64
	Reserved uint64 // set aside by the driver: in no process, not in Used
	// Used is the memory in use: nvidia-smi's memory.used.
	Used uint64
	// Processes are the processes with a context on the GPU and what each
	// uses there: nvidia-smi --query-compute-apps=pid,used_memory. A
	// process whose usage NVML cannot tell is left out, and counted in
	// Unavailable.
	Processes   []Process
	Unavailable int
}

// Process is what one process uses on one GPU.
type Process struct {
	PID  uint32 // in the host's PID namespace (the agent's, with hostPID)
	Used uint64
}

// Sample is every GPU's memory at one moment.
type Sample struct {
	Time time.Time
	GPUs []GPU
}

// Open loads the library at path (a name alone: where the dynamic loader
// finds it) and initializes it. It fails where there is no NVIDIA driver.
func Open(path string) (*NVML, error) {
	handle, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	n := &NVML{handle: handle}
	if err := n.bind(); err != nil {
		purego.Dlclose(handle)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := n.start(); err != nil {
		purego.Dlclose(handle)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// bind finds the functions it calls; a library without one is refused
// (one older than driver 510 lacks the _v3 process list).
func (n *NVML) bind() error {
	for name, fn := range map[string]any{
		"nvmlInit_v2": &n.init, "nvmlShutdown": &n.shutdown, "nvmlErrorString": &n.errorString,
		"nvmlSystemGetDriverVersion": &n.driverVersion, "nvmlDeviceGetCount_v2": &n.count,
		"nvmlDeviceGetHandleByIndex_v2": &n.byIndex, "nvmlDeviceGetUUID": &n.uuid,
		"nvmlDeviceGetMemoryInfo_v2":              &n.memoryInfo,
		"nvmlDeviceGetComputeRunningProcesses_v3": &n.processes,
	} {
		sym, err := purego.Dlsym(n.handle, name)
		if err != nil {
			return fmt.Errorf("find %s: %w", name, err)
		}
		purego.RegisterFunc(fn, sym)
	}
	return nil
}

// start initializes the library and lists its GPUs, which stay for its
// life (NVML sees no GPU come or go).
func (n *NVML) start() error {
	if err := n.check("nvmlInit_v2", n.init()); err != nil {
		return err
	}
	var buf [96]byte // NVML_DEVICE_UUID_V2_BUFFER_SIZE, and more than a version needs
	if err := n.check("nvmlSystemGetDriverVersion", n.driverVersion(&buf[0], uint32(len(buf)))); err != nil {
		n.shutdown()
		return err
	}
	n.DriverVersion = cString(buf[:])
	var count uint32
	if err := n.check("nvmlDeviceGetCount_v2", n.count(&count)); err != nil {
		n.shutdown()
		return err
	}
	for i := range count {
		d := device{index: int(i)}
		if err := n.check("nvmlDeviceGetHandleByIndex_v2", n.byIndex(i, &d.handle)); err != nil {
			n.shutdown()
			return fmt.Errorf("GPU %d: %w", i, err)
		}
		if err := n.check("nvmlDeviceGetUUID", n.uuid(d.handle, &buf[0], uint32(len(buf)))); err != nil {
			n.shutdown()
			return fmt.Errorf("GPU %d: %w", i, err)
		}
		d.uuid = cString(buf[:])
		n.devices = append(n.devices, d)
	}
	return nil
}

// Close shuts the library down and unloads it.
func (n *NVML) Close() error {
	err := n.check("nvmlShutdown", n.shutdown())
	return errors.Join(err, purego.Dlclose(n.handle))
}

// Read samples every GPU into s, reusing its memory.
func (n *NVML) Read(s *Sample) error {
	s.Time = time.Now()
	s.GPUs = slices.Grow(s.GPUs[:0], len(n.devices))[:len(n.devices)]
	for i, d := range n.devices {
		g := &s.GPUs[i]
		mem := memoryV2{version: memoryV2Version}
		if err := n.check("nvmlDeviceGetMemoryInfo_v2", n.memoryInfo(d.handle, &mem)); err != nil {
			return fmt.Errorf("GPU %d: %w", d.index, err)
		}
		*g = GPU{Index: d.index, UUID: d.uuid, Total: mem.total, Reserved: mem.reserved, Used: mem.used,
			Processes: g.Processes[:0]}
		if err := n.readProcesses(d, g); err != nil {
			return fmt.Errorf("GPU %d: %w", d.index, err)
		}
	}
	return nil
}

// readProcesses lists the GPU's processes into g. The list may grow
// between the call that says its length and the one that reads it: asked
// again, a few times.
func (n *NVML) readProcesses(d device, g *GPU) error {
	for range 4 {
		count := uint32(len(n.infos))
		var first *processInfo
		if count > 0 {
			first = &n.infos[0]
		}
		rc := n.processes(d.handle, &count, first)
		if rc == insufficientSize {
			n.infos = make([]processInfo, count+8)
			continue
		}
		if err := n.check("nvmlDeviceGetComputeRunningProcesses_v3", rc); err != nil {
			return err
		}
		for _, p := range n.infos[:count] {
			if p.usedGpuMemory == notAvailable {
				g.Unavailable++
				continue
			}
			g.Processes = append(g.Processes, Process{PID: p.pid, Used: p.usedGpuMemory})
		}
		return nil
	}
	return fmt.Errorf("nvmlDeviceGetComputeRunningProcesses_v3: the list kept growing")
}

// check is nil for NVML_SUCCESS, else the call's error.
func (n *NVML) check(fn string, rc int32) error {
	if rc == success {
		return nil
	}
	return &Error{Func: fn, Code: rc, Text: n.errorString(rc)}
}

// cString is the NUL-terminated string at the start of b.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
