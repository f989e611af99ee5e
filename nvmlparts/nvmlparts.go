// Package nvmlparts parts what NVML says each process holds on a GPU: its
// traced memory (the books' numbers), the contexts and modules gpu-mem saw
// it make (each NVML's growth across its making, charged to the stack that
// made it), the driver's internals (the rest), and what the processes
// gpu-mem does not trace hold. It is the profiler's policy for NVML, and
// pure: it reads neither NVML nor a file, and is fed the reads and the
// books' numbers by the profiler, which decides when to read.
package nvmlparts

import (
	"cmp"
	"slices"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/nvml"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// Stacks of the rows NVML's numbers make, out of the range the profiler's
// stack store hands out (from 1 up): the one frame each shows says what it
// is.
const (
	StackDriverInternal accounting.StackID = ^accounting.StackID(0) - iota
	StackUntraced
)

// ProcessDevice is a process's memory on one CUDA ordinal.
type ProcessDevice struct {
	PID    uint32
	Device int32
}

// Process is what the profiler knows of a process NVML lists.
type Process struct {
	Comm   string
	Traced bool
	// GPUs are the GPUs a traced process sees, by CUDA ordinal (its
	// environment's), to tell NVML's GPUs by; none where that is unknown.
	GPUs map[int]gpuinfo.Device
}

// Read is an NVML read joined with the books: the view (its processes'
// contexts not yet parted out), each traced process's NVML number less its
// traced memory per CUDA ordinal, and the rows of the untraced processes.
type Read struct {
	At   uint64 // when the read ended, on the clock of BPF timestamps
	View *snapshot.GPUMemory
	// Residual is each traced process's NVML number less the more of its
	// traced memory before and after the read: never what an allocation
	// made during the read grew NVML by. Settled are those whose traced
	// memory did not move during the read, whose residual is exact.
	Residual map[ProcessDevice]int64
	Settled  map[ProcessDevice]bool
	Traced   map[ProcessDevice]*snapshot.ProcessMemory // in View
	Untraced map[accounting.Key]uint64
	// OnlyOn is the ordinal of each traced process NVML lists on one GPU
	// only: where what it made on an unknown device is.
	OnlyOn map[uint32]int32
}

// Join joins an NVML sample, read at at, with the traced memory live (per
// process and CUDA ordinal) before and after it; procs are the processes
// the sample lists.
func Join(s *nvml.Sample, at uint64, procs map[uint32]Process, before, after map[ProcessDevice]uint64) Read {
	onGPUs := map[uint32]int{} // how many GPUs each process is on
	for _, gpu := range s.GPUs {
		for _, pr := range gpu.Processes {
			onGPUs[pr.PID]++
		}
	}
	r := Read{At: at, View: &snapshot.GPUMemory{Time: s.Time, GPUs: make([]snapshot.GPU, 0, len(s.GPUs))},
		Residual: map[ProcessDevice]int64{}, Settled: map[ProcessDevice]bool{}, Traced: map[ProcessDevice]*snapshot.ProcessMemory{},
		Untraced: map[accounting.Key]uint64{}, OnlyOn: map[uint32]int32{}}
	for _, gpu := range s.GPUs {
		devices := map[uint32]int32{} // the traced processes' ordinals of the GPU
		v := snapshot.GPU{Index: gpu.Index, UUID: gpu.UUID, Total: gpu.Total, Reserved: gpu.Reserved, Used: gpu.Used}
		var ofProcesses uint64
		for _, pr := range gpu.Processes {
			ofProcesses += pr.Used
			proc := procs[pr.PID]
			pm := snapshot.ProcessMemory{PID: pr.PID, NVML: pr.Used, Comm: proc.Comm}
			device := int32(gpu.Index)
			if proc.Traced {
				device = ordinal(proc.GPUs, gpu)
				pm.Traced = true
				onOneGPU := onGPUs[pr.PID] == 1
				if onOneGPU {
					r.OnlyOn[pr.PID] = device
				}
				was, now := tracedOn(before, pr.PID, device, onOneGPU), tracedOn(after, pr.PID, device, onOneGPU)
				pm.Driver = max(was, now)
				pm.DriverInternal = int64(pr.Used) - int64(pm.Driver)
				r.Residual[ProcessDevice{pr.PID, device}] = pm.DriverInternal
				r.Settled[ProcessDevice{pr.PID, device}] = was == now
				devices[pr.PID] = device
			} else {
				r.Untraced[accounting.Key{PID: pr.PID, Stack: StackUntraced, Kind: memory.KindUntraced, Device: device}] = pr.Used
			}
			pm.GPU = memory.GPU(memory.KindDevice, device)
			v.Processes = append(v.Processes, pm)
		}
		v.NotOfProcesses = gpu.Used - min(ofProcesses, gpu.Used)
		slices.SortFunc(v.Processes, func(a, b snapshot.ProcessMemory) int { return cmp.Compare(a.PID, b.PID) })
		r.View.GPUs = append(r.View.GPUs, v) // its capacity made: the processes stay where they are
		for i := range v.Processes {
			if pm := &v.Processes[i]; pm.Traced {
				r.Traced[ProcessDevice{pm.PID, devices[pm.PID]}] = pm
			}
		}
	}
	return r
}

// tracedOn is process pid's traced memory on device in live; with what it
// made on an unknown device where NVML lists it on one GPU only (made in a
// context gpu-mem did not see created: on this GPU).
func tracedOn(live map[ProcessDevice]uint64, pid uint32, device int32, onOneGPU bool) uint64 {
	n := live[ProcessDevice{pid, device}]
	if onOneGPU {
		n += live[ProcessDevice{pid, memory.DeviceUnknown}]
	}
	return n
}

// ordinal is the CUDA ordinal by which a process that sees gpus names gpu:
// found by its UUID among them; NVML's index where gpu-mem cannot tell
// which GPUs the process sees (no NVIDIA driver's description in /proc, as
// on the simulated driver).
func ordinal(gpus map[int]gpuinfo.Device, gpu nvml.GPU) int32 {
	for ordinal, d := range gpus {
		if d.UUID == gpu.UUID {
			return int32(ordinal)
		}
	}
	return int32(gpu.Index)
}

// Parts are the reads joined so far and what they sized: the latest view,
// NVML's rows, the contexts and modules seen made and the last reads. Its
// owner serializes the calls.
type Parts struct {
	view *snapshot.GPUMemory // the latest, never changed: shared by snapshots
	// rows are NVML's rows: their live bytes are the latest read's, what
	// they grew by counted as allocations, what they shrank by as frees.
	rows map[accounting.Key]accounting.Counters
	// charged are the contexts and modules seen made, sized by the first
	// read after; past are the last reads, newest last.
	charged []*charge
	past    []pastRead
}

// New is parts before any read.
func New() *Parts {
	return &Parts{rows: map[accounting.Key]accounting.Counters{}}
}

// pastReads bounds the reads kept: a charge is sized against the last
// read that ended before its call began, and reads are asked for at every
// context and module made (a framework loads hundreds of modules at its
// start, a context with eager loading takes a second or more).
const pastReads = 64

// pastRead is what one read found, for sizing what was made after it.
type pastRead struct {
	at uint64 // when it ended, on the clock of BPF timestamps
	// residual is each traced process's NVML number less its traced
	// memory on each GPU: what a context or module grew it by;
	// untraced is each untraced process's NVML number.
	residual, untraced map[ProcessDevice]int64
}

// charge is a context seen made or a module seen loaded, until destroyed,
// unloaded or its process gone.
type charge struct {
	row     accounting.Key // its process, the stack that made it, KindContext or KindModule, its device
	address uint64         // the context's or module's handle
	at      uint64         // when its call began (BPF clock)
	bytes   uint64
	sized   bool
}

func (c *charge) processDevice() ProcessDevice { return ProcessDevice{c.row.PID, c.row.Device} }

// View is the latest read's view, never changed: shared by snapshots; nil
// before the first.
func (p *Parts) View() *snapshot.GPUMemory { return p.view }

// Rows are NVML's rows, until the next Update: read-only.
func (p *Parts) Rows() map[accounting.Key]accounting.Counters { return p.rows }

// Made notes a context made or a module loaded by op (on device, with the
// stack that made it, its handle at address, its call begun at began), or
// one destroyed or unloaded: the next read sizes what was made.
func (p *Parts) Made(op memory.Op, pid uint32, device int32, stack accounting.StackID, address, began uint64) {
	kind := memory.KindContext
	if op.LoadsModule() || op.UnloadsModule() {
		kind = memory.KindModule
	}
	if op.MakesContext() || op.LoadsModule() {
		p.charged = append(p.charged, &charge{
			row:     accounting.Key{PID: pid, Stack: stack, Kind: kind, Device: device},
			address: address,
			at:      began,
		})
		return
	}
	p.charged = slices.DeleteFunc(p.charged, func(c *charge) bool {
		return c.row.PID == pid && c.row.Kind == kind && c.address == address
	})
}

// Exited forgets the contexts and modules of a process that exited.
func (p *Parts) Exited(pid uint32) {
	p.charged = slices.DeleteFunc(p.charged, func(c *charge) bool { return c.row.PID == pid })
}

// Update installs a read: the contexts and modules made since the last one
// sized, each process's part beyond them, the view, the rows. It takes r's
// maps: the live rows are built in r.Untraced, the parts set in r.Traced.
func (p *Parts) Update(r Read) {
	p.charged = sizeCharged(p.charged, p.past, r.Residual, r.OnlyOn)
	fitCharged(p.charged, r.Residual, r.Settled)
	read := pastRead{at: r.At, residual: r.Residual, untraced: make(map[ProcessDevice]int64, len(r.Untraced))}
	for k, used := range r.Untraced {
		read.untraced[ProcessDevice{k.PID, k.Device}] = int64(used)
	}
	live := r.Untraced
	inContexts, inModules := map[ProcessDevice]uint64{}, map[ProcessDevice]uint64{}
	for _, c := range p.charged {
		if c.sized {
			live[c.row] += c.bytes
			in := inContexts
			if c.row.Kind == memory.KindModule {
				in = inModules
			}
			in[c.processDevice()] += c.bytes
		}
	}
	for pd, rest := range r.Residual {
		rest -= int64(inContexts[pd] + inModules[pd])
		live[accounting.Key{PID: pd.PID, Stack: StackDriverInternal, Kind: memory.KindDriverInternal, Device: pd.Device}] = uint64(max(rest, 0))
	}
	for pd, pm := range r.Traced {
		pm.Contexts, pm.Modules = inContexts[pd], inModules[pd]
		pm.DriverInternal -= int64(pm.Contexts + pm.Modules)
	}
	p.past = append(p.past[max(len(p.past)-pastReads+1, 0):], read)
	p.view = r.View
	setRows(p.rows, live)
}

// sizeCharged gives the contexts and modules made since the last read
// their bytes: what their process's NVML number less its traced memory
// grew by on their GPU since before they were made (before), shared
// alike by those made on it meanwhile. A module loaded in a context
// gpu-mem did not see made (its device unknown) is on the one GPU NVML
// lists its process on, if one. Sized ones of a process NVML no longer
// lists on their GPU are dropped: gone with it. It returns the charges
// kept.
func sizeCharged(charged []*charge, past []pastRead, residual map[ProcessDevice]int64, onlyOn map[uint32]int32) []*charge {
	made := map[ProcessDevice][]*charge{}
	charged = slices.DeleteFunc(charged, func(c *charge) bool {
		if device, ok := onlyOn[c.row.PID]; ok && c.row.Device == memory.DeviceUnknown {
			c.row.Device = device
		}
		pd := c.processDevice()
		_, listed := residual[pd]
		if !c.sized && listed {
			made[pd] = append(made[pd], c)
		}
		return c.sized && !listed
	})
	for pd, cs := range made {
		grew := uint64(max(residual[pd]-before(past, charged, pd, cs), 0))
		for i, c := range cs {
			c.bytes, c.sized = grew/uint64(len(cs)), true
			if i == 0 {
				c.bytes += grew % uint64(len(cs))
			}
		}
	}
	return charged
}

// fitCharged has the contexts and modules of each process and GPU whose
// read is settled give back what their process's NVML number less its
// traced memory no longer holds: sized by a growth that held more than
// they made (a lazily loaded module's, with other memory made and freed
// since), they are cut to what NVML shows, modules before contexts, the
// newest first. So traced memory, contexts, modules and the rest add up
// to NVML's number at every settled read.
func fitCharged(charged []*charge, residual map[ProcessDevice]int64, settled map[ProcessDevice]bool) {
	over := map[ProcessDevice]uint64{}
	for _, c := range charged {
		if pd := c.processDevice(); c.sized && settled[pd] {
			over[pd] += c.bytes
		}
	}
	for pd, charged := range over {
		over[pd] = uint64(max(int64(charged)-residual[pd], 0))
	}
	byCut := slices.Clone(charged)
	slices.SortStableFunc(byCut, func(a, b *charge) int {
		return cmp.Or(-cmp.Compare(a.row.Kind, b.row.Kind), -cmp.Compare(a.at, b.at))
	})
	for _, c := range byCut {
		pd := c.processDevice()
		if cut := min(over[pd], c.bytes); c.sized && cut > 0 {
			c.bytes -= cut
			over[pd] -= cut
		}
	}
}

// setRows sets the live bytes of NVML's rows; a row not listed is gone,
// as a dropped process's rows are (a context's stack goes with its
// process).
func setRows(rows map[accounting.Key]accounting.Counters, live map[accounting.Key]uint64) {
	for k := range rows {
		if _, listed := live[k]; !listed {
			delete(rows, k)
		}
	}
	for k, now := range live {
		c := rows[k]
		switch was := c.LiveBytes(); {
		case now > was:
			c.AllocBytes += now - was
			c.AllocCount++
		case now < was:
			c.FreeBytes += was - now
			c.FreeCount++
		}
		rows[k] = c
	}
}

// before is what process and GPU pd's NVML number less its traced memory
// was before cs were made: at the last of past that ended before the first
// of them began (a read during a call saw part of its growth; one may come
// after a call and before its event), plus what of charged was made after
// that read and sized already (its growth is counted once). From nothing
// where NVML did not list the process then or no read did, and, where
// gpu-mem did not trace the process then (it attached to it while it ran),
// from its NVML number for modules alone (not theirs), from nothing for a
// context (NVML may have listed the process while making it).
func before(past []pastRead, charged []*charge, pd ProcessDevice, cs []*charge) int64 {
	first := slices.MinFunc(cs, func(a, b *charge) int { return cmp.Compare(a.at, b.at) }).at
	i := len(past) - 1
	for i >= 0 && past[i].at > first {
		i--
	}
	if i < 0 {
		return 0
	}
	was, traced := past[i].residual[pd]
	if !traced && !slices.ContainsFunc(cs, func(c *charge) bool { return c.row.Kind == memory.KindContext }) {
		was = past[i].untraced[pd]
	}
	for _, c := range charged {
		if c.sized && c.at > past[i].at && c.processDevice() == pd {
			was += int64(c.bytes)
		}
	}
	return was
}

// AddToPeaks adds to each process's driver-view peak on a GPU what NVML's
// rows say it holds there beyond its allocations, as last read (its
// contexts, modules and driver internals: held throughout, whatever its
// allocations did), so that a peak is never below what the process holds,
// nor below nvidia-smi's number for it. A process that holds only those
// gets a peak of them, at ts. Only the rows keep says count. A peak's
// rows are copied, once, before the first is added: they may share memory.
func AddToPeaks(peaks []accounting.Peak, rows map[accounting.Key]accounting.Counters, keep func(accounting.Key) bool, ts uint64) []accounting.Peak {
	at := make(map[accounting.PeakKey]int, len(peaks))
	for i, pk := range peaks {
		at[pk.PeakKey] = i
	}
	copied := make([]bool, len(peaks)) // the given peaks whose rows are copied
	for k, c := range rows {
		if k.Kind == memory.KindUntraced || c.LiveBytes() == 0 || !keep(k) {
			continue
		}
		pk := accounting.PeakKey{PID: k.PID, View: memory.ViewDriver, GPU: k.GPU()}
		i, ok := at[pk]
		if !ok {
			i = len(peaks)
			at[pk] = i
			peaks = append(peaks, accounting.Peak{PeakKey: pk, Time: ts})
		}
		held := accounting.Amount{Bytes: c.LiveBytes(), Count: c.LiveCount()}
		peaks[i].Bytes += held.Bytes
		peaks[i].Count += held.Count
		if i < len(copied) && !copied[i] {
			peaks[i].Rows, copied[i] = slices.Clip(peaks[i].Rows), true // the append copies
		}
		peaks[i].Rows = append(peaks[i].Rows, accounting.PeakRow{Key: k, Amount: held})
	}
	return peaks
}
