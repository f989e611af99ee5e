package nvmlparts

import (
	"maps"
	"reflect"
	"testing"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/nvml"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// TestContextsSizedByNVMLsGrowth: contexts made between two reads share
// what their process's NVML number less its traced memory grew by on their
// GPU; one made where NVML did not list the process yet grows from
// nothing; a destroyed one is gone, and so are those of a process NVML no
// longer lists; the rest is the driver's internals. Each row's growth
// counts as an allocation, its shrinking as a free.
func TestContextsSizedByNVMLsGrowth(t *testing.T) {
	g := New()
	made := func(pid uint32, stack accounting.StackID, device int32, address uint64) {
		g.Made(memory.OpCtxCreate, pid, device, stack, address, 0)
	}
	read := func(residual map[ProcessDevice]int64) map[accounting.Key]uint64 {
		return readResidual(g, 0, residual, map[accounting.Key]uint64{})
	}
	ctx := func(pid uint32, stack accounting.StackID) accounting.Key {
		return accounting.Key{PID: pid, Stack: stack, Kind: memory.KindContext}
	}
	internal := func(pid uint32) accounting.Key {
		return accounting.Key{PID: pid, Stack: StackDriverInternal, Kind: memory.KindDriverInternal}
	}

	made(7, 1, 0, 0xa)
	made(7, 2, 0, 0xb)
	if got, want := read(map[ProcessDevice]int64{{7, 0}: 1001}), map[accounting.Key]uint64{ctx(7, 1): 501, ctx(7, 2): 500, internal(7): 0}; !maps.Equal(got, want) {
		t.Errorf("two contexts at once: %v, want %v", got, want)
	}
	made(7, 3, 0, 0xc)
	got := read(map[ProcessDevice]int64{{7, 0}: 1001 + 300 + 40})
	if want := map[accounting.Key]uint64{ctx(7, 1): 501, ctx(7, 2): 500, ctx(7, 3): 340, internal(7): 0}; !maps.Equal(got, want) {
		t.Errorf("a third: %v, want %v", got, want)
	}
	if pm := g.view.GPUs[0].Processes[0]; pm.Contexts != 1341 || pm.DriverInternal != 0 {
		t.Errorf("view %+v, want contexts 1341, nothing else", pm)
	}
	g.Made(memory.OpCtxDestroy, 7, 0, 0, 0xb, 0)
	got = read(map[ProcessDevice]int64{{7, 0}: 1001 + 340 + 60}) // the destroyed one's 500 not given back yet
	if want := map[accounting.Key]uint64{ctx(7, 1): 501, ctx(7, 3): 340, internal(7): 560}; !maps.Equal(got, want) {
		t.Errorf("one destroyed: %v, want %v", got, want)
	}
	if c := g.rows[internal(7)]; c.AllocBytes != 560 || c.AllocCount != 1 {
		t.Errorf("driver-internal counters %+v, want 560 bytes in one growth", c)
	}
	got = read(map[ProcessDevice]int64{{7, 0}: 1001 + 340 + 60 - 500})
	if want := map[accounting.Key]uint64{ctx(7, 1): 501, ctx(7, 3): 340, internal(7): 60}; !maps.Equal(got, want) {
		t.Errorf("given back: %v, want %v", got, want)
	}
	if c := g.rows[internal(7)]; c.FreeBytes != 500 || c.FreeCount != 1 || c.LiveBytes() != 60 {
		t.Errorf("driver-internal counters %+v, want 500 bytes in one shrink", c)
	}
	if got := read(map[ProcessDevice]int64{}); len(got) != 0 || len(g.charged) != 0 {
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
	g := New()
	event := func(op memory.Op, stack accounting.StackID, at, address uint64) {
		g.Made(op, 7, 0, stack, address, at)
	}
	ctx := accounting.Key{PID: 7, Stack: 1, Kind: memory.KindContext}
	module := func(stack accounting.StackID) accounting.Key {
		return accounting.Key{PID: 7, Stack: stack, Kind: memory.KindModule}
	}
	internal := accounting.Key{PID: 7, Stack: StackDriverInternal, Kind: memory.KindDriverInternal}

	event(memory.OpCtxCreate, 1, 50, 0xa)
	readResidual(g, 100, map[ProcessDevice]int64{{7, 0}: 1000}, map[accounting.Key]uint64{})
	event(memory.OpModuleLoadData, 2, 150, 0xb)
	readResidual(g, 200, map[ProcessDevice]int64{{7, 0}: 1300}, map[accounting.Key]uint64{})
	event(memory.OpLibraryLoadData, 3, 250, 0xc)
	readResidual(g, 300, map[ProcessDevice]int64{{7, 0}: 1500}, map[accounting.Key]uint64{})

	unsettled := map[ProcessDevice]bool{{7, 0}: true}
	got := readUnsettled(g, 400, map[ProcessDevice]int64{{7, 0}: 1100}, map[accounting.Key]uint64{}, unsettled)
	if want := map[accounting.Key]uint64{ctx: 1000, module(2): 300, module(3): 200, internal: 0}; !maps.Equal(got, want) {
		t.Errorf("an unsettled read: %v, want %v", got, want)
	}
	got = readResidual(g, 500, map[ProcessDevice]int64{{7, 0}: 1250}, map[accounting.Key]uint64{})
	if want := map[accounting.Key]uint64{ctx: 1000, module(2): 250, module(3): 0, internal: 0}; !maps.Equal(got, want) {
		t.Errorf("250 bytes less: %v, want %v", got, want)
	}
	if pm := g.view.GPUs[0].Processes[0]; pm.Contexts+pm.Modules != 1250 || pm.DriverInternal != 0 {
		t.Errorf("view %+v, want contexts and modules 1250, driver-internal 0", pm)
	}
	got = readResidual(g, 600, map[ProcessDevice]int64{{7, 0}: 1400}, map[accounting.Key]uint64{})
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
	g := New()
	event := func(op memory.Op, pid uint32, stack accounting.StackID, at, address uint64) {
		g.Made(op, pid, 0, stack, address, at)
	}
	read := func(at uint64, residual map[ProcessDevice]int64, untraced map[accounting.Key]uint64) map[accounting.Key]uint64 {
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
	read(100, map[ProcessDevice]int64{{7, 0}: 1000}, map[accounting.Key]uint64{})
	read(200, map[ProcessDevice]int64{{7, 0}: 1300}, map[accounting.Key]uint64{}) // the load's growth, its event not yet in
	event(memory.OpModuleLoadData, 7, 1, 150, 0xa)
	if got, want := read(300, map[ProcessDevice]int64{{7, 0}: 1300}, map[accounting.Key]uint64{}), map[accounting.Key]uint64{module(7, 1): 300}; !maps.Equal(got, want) {
		t.Errorf("a module after a read: %v, want %v", got, want)
	}
	event(memory.OpLibraryLoadData, 7, 2, 350, 0xb)
	event(memory.OpModuleLoad, 7, 3, 360, 0xc)
	event(memory.OpCtxCreate, 7, 4, 370, 0xb) // a context of the library's address
	got := read(400, map[ProcessDevice]int64{{7, 0}: 1300 + 900}, map[accounting.Key]uint64{})
	if want := map[accounting.Key]uint64{module(7, 1): 300, module(7, 2): 300, module(7, 3): 300,
		{PID: 7, Stack: 4, Kind: memory.KindContext}: 300}; !maps.Equal(got, want) {
		t.Errorf("three made at once: %v, want %v", got, want)
	}
	event(memory.OpLibraryUnload, 7, 0, 450, 0xb)
	got = read(500, map[ProcessDevice]int64{{7, 0}: 1300 + 900 - 300}, map[accounting.Key]uint64{})
	if want := map[accounting.Key]uint64{module(7, 1): 300, module(7, 3): 300, {PID: 7, Stack: 4, Kind: memory.KindContext}: 300}; !maps.Equal(got, want) {
		t.Errorf("the library unloaded: %v, want %v", got, want)
	}
	if pm := g.view.GPUs[0].Processes[0]; pm.Modules != 600 || pm.Contexts != 300 || pm.DriverInternal != 1000 {
		t.Errorf("view %+v, want modules 600, contexts 300, driver-internal 1000", pm)
	}

	read(600, map[ProcessDevice]int64{{7, 0}: 1900}, map[accounting.Key]uint64{{PID: 8, Kind: memory.KindUntraced}: 5000})
	event(memory.OpModuleLoadDataEx, 8, 5, 650, 0xd)
	got = read(700, map[ProcessDevice]int64{{7, 0}: 1900, {8, 0}: 5000 + 40}, map[accounting.Key]uint64{})
	if got[module(8, 5)] != 40 {
		t.Errorf("a module of a process attached to: %v, want 40 bytes", got)
	}

	read(800, map[ProcessDevice]int64{{9, 0}: 0}, map[accounting.Key]uint64{})
	read(900, map[ProcessDevice]int64{{9, 0}: 200}, map[accounting.Key]uint64{}) // during the call: part of its growth
	event(memory.OpCtxCreate, 9, 6, 850, 0xe)
	got = read(1000, map[ProcessDevice]int64{{9, 0}: 500}, map[accounting.Key]uint64{})
	if ctx := (accounting.Key{PID: 9, Stack: 6, Kind: memory.KindContext}); got[ctx] != 500 {
		t.Errorf("a context read while it was made: %v, want 500 bytes, from the read before its call began", got)
	}
}

// readResidual has g take a read of NVML at time at: the processes of
// residual traced on GPU 0, with those bytes beyond their traced memory,
// and untraced's rows. It returns every row's live bytes.
func readResidual(g *Parts, at uint64, residual map[ProcessDevice]int64, untraced map[accounting.Key]uint64) map[accounting.Key]uint64 {
	return readUnsettled(g, at, residual, untraced, nil)
}

// readUnsettled is readResidual with the processes of unsettled not
// settled in the read (their traced memory moved during it).
func readUnsettled(g *Parts, at uint64, residual map[ProcessDevice]int64, untraced map[accounting.Key]uint64,
	unsettled map[ProcessDevice]bool) map[accounting.Key]uint64 {
	view := &snapshot.GPUMemory{GPUs: []snapshot.GPU{{}}}
	traced := map[ProcessDevice]*snapshot.ProcessMemory{}
	settled := map[ProcessDevice]bool{}
	for pd, r := range residual {
		view.GPUs[0].Processes = append(view.GPUs[0].Processes, snapshot.ProcessMemory{PID: pd.PID, Traced: true, DriverInternal: r})
		settled[pd] = !unsettled[pd]
	}
	for i := range view.GPUs[0].Processes {
		pm := &view.GPUs[0].Processes[i]
		traced[ProcessDevice{pm.PID, 0}] = pm
	}
	g.Update(Read{At: at, View: view, Residual: residual, Settled: settled, Traced: traced, Untraced: untraced, OnlyOn: map[uint32]int32{}})
	live := map[accounting.Key]uint64{}
	for k, c := range g.rows {
		live[k] = c.LiveBytes()
	}
	return live
}

// TestJoinPartsEachProcess: a traced process is named on NVML's GPU by the
// CUDA ordinal under which its environment shows it, its traced memory the
// more of before and after the read (unsettled when they differ), with
// what it made on an unknown device where NVML lists it on one GPU only;
// an untraced process is a row of its own; what no process uses is the
// GPU's.
func TestJoinPartsEachProcess(t *testing.T) {
	s := &nvml.Sample{GPUs: []nvml.GPU{
		{Index: 0, UUID: "GPU-a", Used: 5000, Processes: []nvml.Process{{PID: 8, Used: 3000}, {PID: 7, Used: 1500}}},
		{Index: 1, UUID: "GPU-b", Used: 900, Processes: []nvml.Process{{PID: 9, Used: 800}}},
	}}
	procs := map[uint32]Process{
		7: {Comm: "train", Traced: true, GPUs: map[int]gpuinfo.Device{0: {UUID: "GPU-b"}, 1: {UUID: "GPU-a"}}},
		8: {Comm: "other"},
		9: {Comm: "serve", Traced: true},
	}
	before := map[ProcessDevice]uint64{{7, 1}: 1000, {7, memory.DeviceUnknown}: 100, {9, 1}: 500}
	after := map[ProcessDevice]uint64{{7, 1}: 1200, {7, memory.DeviceUnknown}: 100, {9, 1}: 500}
	r := Join(s, 42, procs, before, after)

	if want := map[ProcessDevice]int64{{7, 1}: 1500 - 1300, {9, 1}: 300}; !maps.Equal(r.Residual, want) {
		t.Errorf("residual %v, want %v", r.Residual, want)
	}
	if want := map[ProcessDevice]bool{{7, 1}: false, {9, 1}: true}; !maps.Equal(r.Settled, want) {
		t.Errorf("settled %v, want %v", r.Settled, want)
	}
	if want := map[accounting.Key]uint64{{PID: 8, Stack: StackUntraced, Kind: memory.KindUntraced, Device: 0}: 3000}; !maps.Equal(r.Untraced, want) {
		t.Errorf("untraced %v, want %v", r.Untraced, want)
	}
	if want := map[uint32]int32{7: 1, 9: 1}; !maps.Equal(r.OnlyOn, want) {
		t.Errorf("only on %v, want %v", r.OnlyOn, want)
	}
	want := []snapshot.GPU{
		{Index: 0, UUID: "GPU-a", Used: 5000, NotOfProcesses: 500, Processes: []snapshot.ProcessMemory{
			{PID: 7, Comm: "train", GPU: "1", NVML: 1500, Traced: true, Driver: 1300, DriverInternal: 200},
			{PID: 8, Comm: "other", GPU: "0", NVML: 3000},
		}},
		{Index: 1, UUID: "GPU-b", Used: 900, NotOfProcesses: 100, Processes: []snapshot.ProcessMemory{
			{PID: 9, Comm: "serve", GPU: "1", NVML: 800, Traced: true, Driver: 500, DriverInternal: 300},
		}},
	}
	if r.At != 42 || !reflect.DeepEqual(r.View.GPUs, want) {
		t.Errorf("at %d, view %+v, want 42, %+v", r.At, r.View.GPUs, want)
	}
	if pm := r.Traced[ProcessDevice{7, 1}]; pm != &r.View.GPUs[0].Processes[0] {
		t.Errorf("traced process 7 on ordinal 1: %p, want the view's %p", pm, &r.View.GPUs[0].Processes[0])
	}
}
