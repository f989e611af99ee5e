package tests

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/pystack"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// startTensors starts simwork.py's tensor scenario under python, with the
// simulated driver and allocator, then a profiler of it, and returns once the
// profiler walks its frames and, unless the tensor view is off, has attached
// to the allocator.
func startTensors(t *testing.T, cfg profiler.Config, python, scenario string, env ...string) (*session, *workload) {
	t.Helper()
	env = append(env, "SIMCUDA_LIB="+simLib, "SIMTORCH_LIB="+filepath.Join(repoRoot, "build/sim/libc10_cuda.so"))
	w := startWorkload(t, env, python, filepath.Join(repoRoot, "tests/workloads/simwork.py"), scenario)
	s := startProfiler(t, cfg, w)
	s.waitEvent(logs.Python, "pid", w.pid)
	if cfg.Tensors == profiler.TensorsAll {
		s.waitEvent(logs.Attached, "kind", "allocator")
	}
	return s, w
}

// byPythonFunction sums a process's rows of one kind by their innermost
// Python frame.
func byPythonFunction(r *snapshot.Snapshot, pid int, kind memory.Kind) map[string]snapshot.Row {
	rows := map[string]snapshot.Row{}
	for _, row := range r.Rows() {
		if row.PID != uint32(pid) || row.Kind != kind {
			continue
		}
		py := pythonFrames(row.Frames)
		name := "(no Python frame)"
		if len(py) > 0 {
			name = py[0].Function
		}
		if sum, ok := rows[name]; ok {
			row.Counters.Add(sum.Counters)
		}
		rows[name] = row
	}
	return rows
}

// TestTensorsExact: with PyTorch's caching allocator between the program and
// the driver, the tensor view charges each tensor to the Python function that
// asked for it, and frees release it exactly; the driver view shows the
// segments the allocator holds, under the function whose tensor grew them.
func TestTensorsExact(t *testing.T) {
	for _, python := range pythons(t) {
		t.Run(pythonName(python), func(t *testing.T) { testTensorsExact(t, python) })
	}
}

func testTensorsExact(t *testing.T, python string) {
	s, w := startTensors(t, profiler.Config{Library: simLib}, python, "tensors")
	expect := w.run()
	r := s.report()
	const MiB = 1 << 20
	tensors := byPythonFunction(r, w.pid, memory.KindTensor)
	if tensors["activations"].LiveBytes() != expect["tensor_activations"] {
		t.Errorf("activations live %d, workload holds %d", tensors["activations"].LiveBytes(), expect["tensor_activations"])
	}
	for fn, want := range map[string]accounting.Counters{
		"load_weights": {AllocBytes: expect["tensor_load_weights"], AllocCount: 3},
		"kv_cache":     {AllocBytes: expect["tensor_kv_cache"], AllocCount: 1},
		"activations":  {AllocBytes: 8 * 300000, AllocCount: 8, FreeBytes: 6 * 300000, FreeCount: 6},
	} {
		row := tensors[fn]
		if row.Counters != want || row.Key.Device != 0 {
			t.Errorf("tensors of %s: %+v on device %d, want %+v on 0", fn, row.Counters, row.Key.Device, want)
		}
		delete(tensors, fn)
	}
	if len(tensors) != 0 {
		t.Errorf("tensor rows elsewhere: %v", tensors)
	}
	segments := byPythonFunction(r, w.pid, memory.KindDevice)
	for fn, want := range map[string]uint64{"load_weights": 20 * MiB, "kv_cache": 12 * MiB, "activations": 4 * MiB} {
		if row := segments[fn]; row.LiveBytes() != want || row.AllocBytes != want || row.Key.Device != 0 {
			t.Errorf("segments of %s: %+v on device %d, want %d live", fn, row.Counters, row.Key.Device, want)
		}
	}
	if r.Python.Missing != 0 {
		t.Errorf("python stats %+v", r.Python)
	}
	assertNoLosses(t, r)
	w.exit()
}

// TestTensorOutOfMemorySnapshot: a process fills device memory with tensors
// from fill_cache, then asks five times for more than is left from
// big_batch. One snapshot, taken at the driver's first refusal, names
// big_batch as the asker and fill_cache as what held the memory, in both
// views, byte for byte; record --on-oom writes it as pprof and folded files.
func TestTensorOutOfMemorySnapshot(t *testing.T) {
	const MiB = 1 << 20
	python := pythons(t)[2]
	dir := t.TempDir()
	var mu sync.Mutex
	var ooms []snapshot.OOM
	cfg := profiler.Config{Library: simLib, OnOOM: func(o snapshot.OOM) {
		mu.Lock()
		ooms = append(ooms, o)
		mu.Unlock()
	}}
	s, w := startTensors(t, cfg, python, "tensor_oom", "SIMCUDA_CAPACITY=104857600")
	c := startCLI(t, "record", "--pid", strconv.Itoa(w.pid), "--library", simLib, "--on-oom", dir, "-o", filepath.Join(dir, "all.pb.gz"))
	c.waitEvent(logs.Attached, "kind", "allocator")
	expect := w.run()
	if expect["result"] != 2 || expect["requested"] != 40*MiB || expect["held"] != 72*MiB {
		t.Fatalf("workload: %v", expect)
	}
	r := s.report()
	c.interrupt()

	mu.Lock()
	defer mu.Unlock()
	// Each of the five attempts asks the driver twice (again after emptying
	// the cache, from another call site): one out-of-memory, one snapshot.
	if len(ooms) != 1 || len(r.OOMs) != 1 {
		t.Fatalf("%d snapshots delivered, %d in the report", len(ooms), len(r.OOMs))
	}
	o := ooms[0]
	if py := pythonFrames(o.Failure.Frames); len(py) == 0 || py[0].Function != "big_batch" || o.Failure.Bytes != 40*MiB ||
		o.Failure.Op.Symbol() != "cuMemAlloc_v2" || o.Failure.PID != uint32(w.pid) {
		t.Errorf("failure %+v at %v", o.Failure.FailureKey, frameNames(o.Failure.Frames))
	}
	if o.HeldBy(memory.KindTensor) != 72*MiB || o.HeldBy(memory.KindDevice) != 72*MiB || len(o.Held) != 2 {
		t.Errorf("held %d in tensors, %d in segments, %d rows", o.HeldBy(memory.KindTensor), o.HeldBy(memory.KindDevice), len(o.Held))
	}
	for _, row := range o.Held {
		if py := pythonFrames(row.Frames); len(py) == 0 || py[0].Function != "fill_cache" || row.LiveCount() != 6 {
			t.Errorf("held %s: %d bytes in %d from %v", row.Kind, row.LiveBytes(), row.LiveCount(), frameNames(row.Frames))
		}
	}
	// After the failed attempts, the books go on exactly.
	if after := byPythonFunction(r, w.pid, memory.KindTensor)["after_oom"]; after.LiveBytes() != expect["tensor_after_oom"] || after.AllocCount != 4 {
		t.Errorf("after the out-of-memory: %+v, workload holds %d", after.Counters, expect["tensor_after_oom"])
	}
	assertNoLosses(t, r)
	w.exit()

	// The snapshot's files keep the views apart: folded, one per view;
	// pprof, each view under its own sample types.
	files, _ := filepath.Glob(filepath.Join(dir, fmt.Sprintf("oom-%d-*", w.pid)))
	if len(files) != 3 {
		t.Fatalf("record --on-oom wrote %v", files)
	}
	base := filepath.Join(dir, fmt.Sprintf("oom-%d-1", w.pid))
	for path, bytes := range map[string]uint64{base + ".folded": 72 * MiB, base + ".tensor.folded": 72 * MiB} {
		if got := foldedTotal(t, path); got != bytes {
			t.Errorf("%s holds %d bytes, want %d", filepath.Base(path), got, bytes)
		}
		folded, _ := os.ReadFile(path)
		for _, line := range strings.Split(strings.TrimSpace(string(folded)), "\n") {
			if !strings.Contains(line, ";fill_cache") {
				t.Errorf("folded line not from fill_cache: %s", line)
			}
		}
	}
	p := readProfile(t, base+".pb.gz")
	totals := map[string]int64{}
	for _, s := range p.Sample {
		for i, st := range p.SampleType {
			totals[st.Type] += s.Value[i]
		}
	}
	if totals["inuse_space"] != 72*MiB || totals["tensor_inuse_space"] != 72*MiB {
		t.Errorf("pprof snapshot: %v, want 72 MiB in each view", totals)
	}
}

// TestTensorViewOff: with NoTensors (--tensors=false) the allocator is left
// alone, and the driver view is as before.
func TestTensorViewOff(t *testing.T) {
	s, w := startTensors(t, profiler.Config{Library: simLib, Tensors: profiler.TensorsOff}, pythons(t)[2], "tensors")
	w.run()
	r := s.report()
	if rows := byPythonFunction(r, w.pid, memory.KindTensor); len(rows) != 0 {
		t.Errorf("tensor rows with the tensor view off: %v", rows)
	}
	if segments := byPythonFunction(r, w.pid, memory.KindDevice); segments["kv_cache"].LiveBytes() != 12<<20 {
		t.Errorf("driver view: %v", segments)
	}
	w.exit()
}

// TestTensorNativeStacks: a tensor allocated from Python keeps the
// allocator's frame and its Python frames; --tensor-native-stacks walks the
// native frames between them too. Bytes are the same either way.
func TestTensorNativeStacks(t *testing.T) {
	python := "/root/.pyenv/versions/3.12.1/bin/python3.12"
	native := map[bool][]string{}
	for _, walk := range []bool{false, true} {
		s, w := startTensors(t, profiler.Config{Library: simLib, TensorNativeStacks: walk}, python, "tensors")
		expect := w.run()
		row := byPythonFunction(s.report(), w.pid, memory.KindTensor)["load_weights"]
		if row.AllocBytes != expect["tensor_load_weights"] {
			t.Errorf("native walk %v: load_weights allocated %d, want %d", walk, row.AllocBytes, expect["tensor_load_weights"])
		}
		for _, f := range row.Frames {
			if f.File != "" {
				break
			}
			native[walk] = append(native[walk], f.Name())
		}
		w.exit()
		s.stop()
	}
	const malloc = "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate" // as in torch
	if got := strings.Join(native[false], " <- "); got != "pytorch:malloc <- "+malloc {
		t.Errorf("native frames %s, want the allocator's alone", got)
	}
	if got := native[true]; len(got) < 4 || got[1] != malloc || !slices.Contains(got, "simtorch_malloc") {
		t.Errorf("native frames with the walk: %v", got)
	}
}

// TestTensorStacksSentOnce: a thread's tensor allocation from a Python
// stack it sent whole before names that stack instead of sending it again,
// and still reaches the books with its exact frames. Three stacks, 50
// tensors each, on two threads: three events carry their frames, the
// other 147 name them.
func TestTensorStacksSentOnce(t *testing.T) {
	for _, python := range pythons(t) {
		t.Run(pythonName(python), func(t *testing.T) { testTensorStacksSentOnce(t, python) })
	}
}

func testTensorStacksSentOnce(t *testing.T, python string) {
	allocator := filepath.Join(repoRoot, "build/sim/libc10_cuda.so")
	w := startWorkload(t, []string{"SIMCUDA_LIB=" + simLib, "SIMTORCH_LIB=" + allocator}, python,
		filepath.Join(repoRoot, "tests/workloads/simwork.py"), "tensor_repeats")
	tr := traceTensors(t, allocator, w.pid)
	expect := w.run()
	if err := tr.Flush(); err != nil {
		t.Fatal(err)
	}
	stacks := map[uint64][][]tracer.PyFrame{} // by tensor size
	var ev tracer.Event
	for {
		err := tr.Read(&ev)
		if errors.Is(err, ringbuf.ErrFlushed) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Op != memory.OpTensorAlloc {
			continue
		}
		if ev.Flags != 0 {
			t.Errorf("tensor of %d bytes: stack flags %#x", ev.Bytes, ev.Flags)
		}
		stacks[ev.Bytes] = append(stacks[ev.Bytes], slices.Clone(ev.PyFrames))
	}
	repeats := int(expect["repeats"])
	for _, size := range []uint64{1024, 2048, 3072} {
		got, want := stacks[size], int(expect[fmt.Sprintf("frames%d", size)])
		if len(got) != repeats {
			t.Errorf("%d tensors of %d bytes, want %d", len(got), size, repeats)
			continue
		}
		for i, frames := range got {
			if len(frames) != want || !slices.Equal(frames, got[0]) {
				t.Errorf("tensor %d of %d bytes: %d Python frames %v, want %d as the first's %v", i, size, len(frames), frames, want, got[0])
			}
		}
		delete(stacks, size)
	}
	if len(stacks) != 0 {
		t.Errorf("tensors of other sizes: %d", len(stacks))
	}
	if named := tr.NamedPyStacks(); named != uint64(3*repeats-3) {
		t.Errorf("%d events named their stacks, want %d", named, 3*repeats-3)
	}
	w.exit()
}

// traceTensors starts a tracer of process pid's tensors alone, its Python
// frames walked.
func traceTensors(t *testing.T, allocator string, pid int) *tracer.Tracer {
	t.Helper()
	tr, err := tracer.New(tracer.Options{PIDs: []uint32{uint32(pid)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	probes, err := tr.AttachAllocator(allocator, uint32(pid))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { probes.Close() })
	proc, err := pystack.Detect("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.AddPython(uint32(pid), proc.Walk()); err != nil {
		t.Fatal(err)
	}
	return tr
}
