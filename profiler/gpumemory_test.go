package profiler

import (
	"maps"
	"testing"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// TestContextsSizedByNVMLsGrowth: contexts made between two reads share
// what their process's NVML number less its traced memory grew by on their
// GPU; one made where NVML did not list the process yet grows from
// nothing; a destroyed one is gone, and so are those of a process NVML no
// longer lists; the rest is the driver's internals. Each row's growth
// counts as an allocation, its shrinking as a free.
func TestContextsSizedByNVMLsGrowth(t *testing.T) {
	g := (&Profiler{}).newGPUMemory("libnvidia-ml.so.1") // never loaded: its job is not started
	made := func(pid uint32, stack accounting.StackID, device int32, address uint64) {
		g.madeEvent(&tracer.Event{PID: pid, Op: memory.OpCtxCreate, Device: device, Address: address}, stack)
	}
	read := func(residual map[processDevice]int64) map[accounting.Key]uint64 {
		return readResidual(g, 0, residual, map[accounting.Key]uint64{})
	}
	ctx := func(pid uint32, stack accounting.StackID) accounting.Key {
		return accounting.Key{PID: pid, Stack: stack, Kind: memory.KindContext}
	}
	internal := func(pid uint32) accounting.Key {
		return accounting.Key{PID: pid, Stack: stackDriverInternal, Kind: memory.KindDriverInternal}
	}

	made(7, 1, 0, 0xa)
	made(7, 2, 0, 0xb)
	if got, want := read(map[processDevice]int64{{7, 0}: 1001}), map[accounting.Key]uint64{ctx(7, 1): 501, ctx(7, 2): 500, internal(7): 0}; !maps.Equal(got, want) {
		t.Errorf("two contexts at once: %v, want %v", got, want)
	}
	made(7, 3, 0, 0xc)
	got := read(map[processDevice]int64{{7, 0}: 1001 + 300 + 40})
	if want := map[accounting.Key]uint64{ctx(7, 1): 501, ctx(7, 2): 500, ctx(7, 3): 340, internal(7): 0}; !maps.Equal(got, want) {
		t.Errorf("a third: %v, want %v", got, want)
	}
	if pm := g.view.GPUs[0].Processes[0]; pm.Contexts != 1341 || pm.DriverInternal != 0 {
		t.Errorf("view %+v, want contexts 1341, nothing else", pm)
	}
	g.madeEvent(&tracer.Event{PID: 7, Op: memory.OpCtxDestroy, Address: 0xb}, 0)
	got = read(map[processDevice]int64{{7, 0}: 1001 + 340 + 60}) // the destroyed one's 500 not given back yet
	if want := map[accounting.Key]uint64{ctx(7, 1): 501, ctx(7, 3): 340, internal(7): 560}; !maps.Equal(got, want) {
		t.Errorf("one destroyed: %v, want %v", got, want)
	}
	if c := g.rows[internal(7)]; c.AllocBytes != 560 || c.AllocCount != 1 {
		t.Errorf("driver-internal counters %+v, want 560 bytes in one growth", c)
	}
	got = read(map[processDevice]int64{{7, 0}: 1001 + 340 + 60 - 500})
	if want := map[accounting.Key]uint64{ctx(7, 1): 501, ctx(7, 3): 340, internal(7): 60}; !maps.Equal(got, want) {
		t.Errorf("given back: %v, want %v", got, want)
	}
	if c := g.rows[internal(7)]; c.FreeBytes != 500 || c.FreeCount != 1 || c.LiveBytes() != 60 {
		t.Errorf("driver-internal counters %+v, want 500 bytes in one shrink", c)
	}
	if got := read(map[processDevice]int64{}); len(got) != 0 || len(g.charged) != 0 {
		t.Errorf("the process gone: rows %v, contexts %d; want none", got, len(g.charged))
	}
}

// TestChargesCutToWhatNVMLShows: a module sized by a growth that held
// more than it made (a lazy load's, with memory made and freed since)
// gives back what a later settled read no longer shows, before the
// context and the oldest module, so that the parts add up to NVML's
// number; a read during which the process's traced memory moved changes
// no charge.
func TestChargesCutToWhatNVMLShows(t *testing.T) {
	g := (&Profiler{}).newGPUMemory("libnvidia-ml.so.1") // never loaded: its job is not started
	event := func(op memory.Op, stack accounting.StackID, at, address uint64) {
		g.madeEvent(&tracer.Event{PID: 7, Op: op, Began: at, Address: address}, stack)
	}
	ctx := accounting.Key{PID: 7, Stack: 1, Kind: memory.KindContext}
	module := func(stack accounting.StackID) accounting.Key {
		return accounting.Key{PID: 7, Stack: stack, Kind: memory.KindModule}
	}
	internal := accounting.Key{PID: 7, Stack: stackDriverInternal, Kind: memory.KindDriverInternal}

	event(memory.OpCtxCreate, 1, 50, 0xa)
	readResidual(g, 100, map[processDevice]int64{{7, 0}: 1000}, map[accounting.Key]uint64{})
	event(memory.OpModuleLoadData, 2, 150, 0xb)
	readResidual(g, 200, map[processDevice]int64{{7, 0}: 1300}, map[accounting.Key]uint64{})
	event(memory.OpLibraryLoadData, 3, 250, 0xc)
	readResidual(g, 300, map[processDevice]int64{{7, 0}: 1500}, map[accounting.Key]uint64{})

	unsettled := map[processDevice]bool{{7, 0}: true}
	got := readUnsettled(g, 400, map[processDevice]int64{{7, 0}: 1100}, map[accounting.Key]uint64{}, unsettled)
	if want := map[accounting.Key]uint64{ctx: 1000, module(2): 300, module(3): 200, internal: 0}; !maps.Equal(got, want) {
		t.Errorf("an unsettled read: %v, want %v", got, want)
	}
	got = readResidual(g, 500, map[processDevice]int64{{7, 0}: 1250}, map[accounting.Key]uint64{})
	if want := map[accounting.Key]uint64{ctx: 1000, module(2): 250, module(3): 0, internal: 0}; !maps.Equal(got, want) {
		t.Errorf("250 bytes less: %v, want %v", got, want)
	}
	if pm := g.view.GPUs[0].Processes[0]; pm.Contexts+pm.Modules != 1250 || pm.DriverInternal != 0 {
		t.Errorf("view %+v, want contexts and modules 1250, driver-internal 0", pm)
	}
	got = readResidual(g, 600, map[processDevice]int64{{7, 0}: 1400}, map[accounting.Key]uint64{})
	if want := map[accounting.Key]uint64{ctx: 1000, module(2): 250, module(3): 0, internal: 150}; !maps.Equal(got, want) {
		t.Errorf("growing again: %v, want %v (what the modules gave back is not taken again)", got, want)
	}
}

// TestModulesSizedAgainstTheReadBeforeThem: a module whose event comes
// after a read that already saw its growth is sized against the last read
// that ended before its call began (300 bytes, not 0); modules made
// between two reads share the growth; an unload ends a module's row (not
// a context's of the same address); a process gpu-mem attached to while it
// ran has its first module sized from its NVML number then, not from
// nothing; a context read while it was being made (eager loading takes
// seconds) is sized from the read before its call began.
func TestModulesSizedAgainstTheReadBeforeThem(t *testing.T) {
	g := (&Profiler{}).newGPUMemory("libnvidia-ml.so.1") // never loaded: its job is not started
	event := func(op memory.Op, pid uint32, stack accounting.StackID, at, address uint64) {
		g.madeEvent(&tracer.Event{PID: pid, Op: op, Began: at, Address: address}, stack)
	}
	read := func(at uint64, residual map[processDevice]int64, untraced map[accounting.Key]uint64) map[accounting.Key]uint64 {
		live := readResidual(g, at, residual, untraced)
		for k := range live {
			if k.Kind != memory.KindModule && k.Kind != memory.KindContext {
				delete(live, k)
			}
		}
		return live
	}
	module := func(pid uint32, stack accounting.StackID) accounting.Key {
		return accounting.Key{PID: pid, Stack: stack, Kind: memory.KindModule}
	}
	read(100, map[processDevice]int64{{7, 0}: 1000}, map[accounting.Key]uint64{})
	read(200, map[processDevice]int64{{7, 0}: 1300}, map[accounting.Key]uint64{}) // the load's growth, its event not yet in
	event(memory.OpModuleLoadData, 7, 1, 150, 0xa)
	if got, want := read(300, map[processDevice]int64{{7, 0}: 1300}, map[accounting.Key]uint64{}), map[accounting.Key]uint64{module(7, 1): 300}; !maps.Equal(got, want) {
		t.Errorf("a module after a read: %v, want %v", got, want)
	}
	event(memory.OpLibraryLoadData, 7, 2, 350, 0xb)
	event(memory.OpModuleLoad, 7, 3, 360, 0xc)
	event(memory.OpCtxCreate, 7, 4, 370, 0xb) // a context of the library's address
	got := read(400, map[processDevice]int64{{7, 0}: 1300 + 900}, map[accounting.Key]uint64{})
	if want := map[accounting.Key]uint64{module(7, 1): 300, module(7, 2): 300, module(7, 3): 300,
		{PID: 7, Stack: 4, Kind: memory.KindContext}: 300}; !maps.Equal(got, want) {
		t.Errorf("three made at once: %v, want %v", got, want)
	}
	event(memory.OpLibraryUnload, 7, 0, 450, 0xb)
	got = read(500, map[processDevice]int64{{7, 0}: 1300 + 900 - 300}, map[accounting.Key]uint64{})
	if want := map[accounting.Key]uint64{module(7, 1): 300, module(7, 3): 300, {PID: 7, Stack: 4, Kind: memory.KindContext}: 300}; !maps.Equal(got, want) {
		t.Errorf("the library unloaded: %v, want %v", got, want)
	}
	if pm := g.view.GPUs[0].Processes[0]; pm.Modules != 600 || pm.Contexts != 300 || pm.DriverInternal != 1000 {
		t.Errorf("view %+v, want modules 600, contexts 300, driver-internal 1000", pm)
	}

	read(600, map[processDevice]int64{{7, 0}: 1900}, map[accounting.Key]uint64{{PID: 8, Kind: memory.KindUntraced}: 5000})
	event(memory.OpModuleLoadDataEx, 8, 5, 650, 0xd)
	got = read(700, map[processDevice]int64{{7, 0}: 1900, {8, 0}: 5000 + 40}, map[accounting.Key]uint64{})
	if got[module(8, 5)] != 40 {
		t.Errorf("a module of a process attached to: %v, want 40 bytes", got)
	}

	read(800, map[processDevice]int64{{9, 0}: 0}, map[accounting.Key]uint64{})
	read(900, map[processDevice]int64{{9, 0}: 200}, map[accounting.Key]uint64{}) // during the call: part of its growth
	event(memory.OpCtxCreate, 9, 6, 850, 0xe)
	got = read(1000, map[processDevice]int64{{9, 0}: 500}, map[accounting.Key]uint64{})
	if ctx := (accounting.Key{PID: 9, Stack: 6, Kind: memory.KindContext}); got[ctx] != 500 {
		t.Errorf("a context read while it was made: %v, want 500 bytes, from the read before its call began", got)
	}
}

// readResidual has g take a read of NVML at time at: the processes of
// residual traced on GPU 0, with those bytes beyond their traced memory,
// and untraced's rows. It returns every row's live bytes.
func readResidual(g *gpuMemory, at uint64, residual map[processDevice]int64, untraced map[accounting.Key]uint64) map[accounting.Key]uint64 {
	return readUnsettled(g, at, residual, untraced, nil)
}

// readUnsettled is readResidual with the processes of unsettled not
// settled in the read (their traced memory moved during it).
func readUnsettled(g *gpuMemory, at uint64, residual map[processDevice]int64, untraced map[accounting.Key]uint64,
	unsettled map[processDevice]bool) map[accounting.Key]uint64 {
	view := &snapshot.GPUMemory{GPUs: []snapshot.GPU{{}}}
	traced := map[processDevice]*snapshot.ProcessMemory{}
	settled := map[processDevice]bool{}
	for pd, r := range residual {
		view.GPUs[0].Processes = append(view.GPUs[0].Processes, snapshot.ProcessMemory{PID: pd.pid, Traced: true, DriverInternal: r})
		settled[pd] = !unsettled[pd]
	}
	for i := range view.GPUs[0].Processes {
		pm := &view.GPUs[0].Processes[i]
		traced[processDevice{pm.PID, 0}] = pm
	}
	g.update(reconciled{at: at, view: view, residual: residual, settled: settled, traced: traced, untraced: untraced, onlyOn: map[uint32]int32{}})
	live := map[accounting.Key]uint64{}
	for k, c := range g.rows {
		live[k] = c.LiveBytes()
	}
	return live
}
