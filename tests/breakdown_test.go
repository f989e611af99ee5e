package tests

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/breakdown"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// userRules sorts simwork.py's functions as a user's file would: its
// weights, its KV cache, and the workspace it takes from the driver.
const userRules = `# simwork.py's own names
parameters                      function=load_weights
kv_cache                        function=kv_cache    file=*/simwork.py
library_workspaces/workspace    function=library_workspace
`

// jsonBreakdown is record's JSON breakdown, as a reader decodes it.
type jsonBreakdown struct {
	PID        uint32 `json:"pid"`
	GPU        string `json:"gpu"`
	Bytes      uint64 `json:"bytes"`
	NVML       bool   `json:"nvml"`
	TensorView bool   `json:"tensor_view"`
	Categories []struct {
		Category  string            `json:"category"`
		Library   string            `json:"library"`
		Bytes     uint64            `json:"bytes"`
		TopStacks []json.RawMessage `json:"top_stacks"`
	} `json:"categories"`
	Fragmentation *struct {
		FreeInSegments   uint64 `json:"free_in_segments_bytes"`
		LargestFreeBlock uint64 `json:"largest_free_block_bytes"`
	} `json:"fragmentation"`
}

// TestBreakdownOfSimulatedTorch: a PyTorch-shaped process (simwork.py
// views: weights, a KV cache and activations from the simulated caching
// allocator, a workspace straight from the driver) broken down by a
// user's rules file given to record, every category exact: the tensors'
// by the allocator's own requested bytes, the cache its segments less its
// tensors, NVML's parts the rest of nvidia-smi's number, which the parts
// sum to. The fragmentation is the allocator's own free blocks (their sum
// and the largest), the sum larger by its rounding of each live block.
func TestBreakdownOfSimulatedTorch(t *testing.T) {
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "simwork.rules")
	if err := os.WriteFile(rulesPath, []byte(userRules), 0o644); err != nil {
		t.Fatal(err)
	}
	env := nvmlState(t, 7*MiB)
	s, w := startTensors(t, profiler.Config{Library: simLib, Tensors: profiler.TensorsAll, NVML: simNVML()}, pythons(t)[2], "breakdown", env...)
	out, page := filepath.Join(dir, "record.json"), filepath.Join(dir, "record.html")
	var clis []*cli
	for _, format := range []string{"json", "html"} {
		c := startCLI(t, "record", "--pid", strconv.Itoa(w.pid), "--library", simLib, "--tensors", "--nvml-library", simNVML(),
			"--breakdown-rules", rulesPath, "--format", format, "-o", filepath.Join(dir, "record."+format))
		c.waitEvent(logs.Attached, "kind", "allocator")
		clis = append(clis, c)
	}
	expect := w.run()
	r := s.report()
	for _, c := range clis {
		c.interrupt()
	}
	rules, err := breakdown.Load(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	breakdown.Fill(r, rules)
	b := breakdownOf(t, r.Breakdown, w.pid, "0")
	nvml, _ := r.GPUMemory.Of(uint32(w.pid), "0")
	if nvml == nil {
		t.Fatalf("NVML says nothing of pid %d: %+v", w.pid, r.GPUMemory)
	}
	want := map[string]uint64{
		snapshot.Parameters:            expect["tensor_load_weights"],
		snapshot.KVCache:               expect["tensor_kv_cache"],
		snapshot.Gradients:             expect["tensor_gradients"],
		snapshot.Activations:           expect["tensor_activations"],
		snapshot.AllocatorCache:        expect["reserved"] - expect["tensor_live"],
		"library_workspaces/workspace": 6 * MiB,
	}
	nvmlParts := uint64(0)
	for _, p := range b.Parts {
		switch p.Category {
		case snapshot.Context, snapshot.Modules, snapshot.DriverInternal:
			nvmlParts += p.Bytes
			continue
		}
		if want[p.Name()] != p.Bytes {
			t.Errorf("%s: %d bytes, want %d", p.Name(), p.Bytes, want[p.Name()])
		}
		delete(want, p.Name())
	}
	if len(want) != 0 {
		t.Errorf("parts missing: %v", want)
	}
	checkAutogradThread(t, b)
	if b.Bytes() != nvml.NVML || nvmlParts != nvml.NVML-expect["driver_live"] || !b.NVML || !b.TensorView {
		t.Errorf("parts sum to %d (NVML's parts %d), NVML says %d of which %d traced", b.Bytes(), nvmlParts, nvml.NVML, expect["driver_live"])
	}
	frag := snapshot.Fragmentation{FreeInSegments: expect["inactive"] + expect["allocated"] - expect["tensor_live"], LargestFreeBlock: expect["largest_inactive"]}
	if b.Fragmentation == nil || *b.Fragmentation != frag {
		t.Errorf("fragmentation %+v, want %+v (the allocator's free blocks %d, and its rounding of live blocks %d)",
			b.Fragmentation, frag, expect["inactive"], expect["allocated"]-expect["tensor_live"])
	}

	// record --breakdown-rules writes the same breakdown in its JSON.
	var report struct {
		Breakdown []jsonBreakdown `json:"breakdown"`
	}
	readJSON(t, out, &report)
	if len(report.Breakdown) != 1 {
		t.Fatalf("record's breakdown: %+v", report.Breakdown)
	}
	// record's own NVML reads part NVML's number into the context and the
	// driver's internals by their own timing: those two are compared by
	// their sum, every other part to the byte.
	j := report.Breakdown[0]
	if j.PID != uint32(w.pid) || j.GPU != "0" || j.Bytes != b.Bytes() || !j.NVML || !j.TensorView ||
		j.Fragmentation == nil || j.Fragmentation.FreeInSegments != frag.FreeInSegments || j.Fragmentation.LargestFreeBlock != frag.LargestFreeBlock {
		t.Errorf("record's breakdown %+v, want %+v", j, b)
	}
	recorded := map[string]uint64{}
	for _, p := range j.Categories {
		name := p.Category
		if p.Library != "" {
			name += "/" + p.Library
		}
		if len(p.TopStacks) == 0 {
			t.Errorf("record's %s: no stacks", name)
		}
		recorded[byNVMLPart(name)] += p.Bytes
	}
	profiled := map[string]uint64{}
	for _, p := range b.Parts {
		profiled[byNVMLPart(p.Name())] += p.Bytes
	}
	if !maps.Equal(recorded, profiled) {
		t.Errorf("record's parts %v, want %v", recorded, profiled)
	}

	// The HTML report's stacked bar: a click on a part shows the flame
	// graph of its stacks alone.
	dom := dumpDOM(t, "file://"+page+"#part="+strconv.Itoa(w.pid)+"/0/kv_cache")
	if !strings.Contains(dom, `data-part="`+strconv.Itoa(w.pid)+`/0/kv_cache"`) {
		t.Error("the click on kv_cache's part did not show it")
	}
	if got := frameAttr(t, dom, "root", "all processes", "data-bytes"); got != strconv.FormatUint(expect["tensor_kv_cache"], 10) {
		t.Errorf("kv_cache's flame graph holds %s bytes, want %d", got, expect["tensor_kv_cache"])
	}
	if got := frameAttr(t, dom, "python", "kv_cache", "data-bytes"); got != strconv.FormatUint(expect["tensor_kv_cache"], 10) {
		t.Errorf("kv_cache's frame %s bytes", got)
	}
	w.exit()
}

// checkAutogradThread: the gradient made on a native thread named
// pt_autograd_0 (a backward pass's) is claimed by its thread's frame, the
// outermost of its stack, and the thread's name is not taken for the
// process's.
func checkAutogradThread(t *testing.T, b snapshot.Breakdown) {
	t.Helper()
	for _, p := range b.Parts {
		if p.Category != snapshot.Gradients {
			continue
		}
		frames := p.Top[0].Frames
		if len(p.Top) != 1 || frames[len(frames)-1].Function != "[thread pt_autograd_0]" {
			t.Errorf("the gradient's stacks %+v, want one ending in [thread pt_autograd_0]", p.Top)
		}
	}
	if b.Comm != "python3.12" {
		t.Errorf("the process is named %q, want python3.12", b.Comm)
	}
}

// TestLimitOfPyTorchsOwn: torch.cuda.set_per_process_memory_fraction
// refuses 24 MiB without asking the driver. PyTorch's allocator reports its
// out-of-memory (c10::reportOutOfMemoryToProfiler, in libc10.so) before it
// raises: the verdict is a limit of its own, the GPU's free bytes NVML's,
// in the snapshot (with the tensor view) and in the out-of-memory line of
// a record of the driver view only, as the agent runs by default. (A driver's refusal
// followed by the same report stays one out-of-memory:
// TestFragmentationVerdict.)
func TestLimitOfPyTorchsOwn(t *testing.T) {
	t.Setenv("SIMCUDA_CAPACITY", strconv.Itoa(88*MiB)) // the GPU NVML reads
	env := append(nvmlState(t, MiB), "SIMCUDA_CAPACITY="+strconv.Itoa(88*MiB))
	s, w := startTensors(t, profiler.Config{Library: simLib, Tensors: profiler.TensorsAll, NVML: simNVML()}, pythons(t)[2], "fraction_oom", env...)
	dir := t.TempDir()
	c := startCLI(t, "record", "--pid", strconv.Itoa(w.pid), "--library", simLib, "--tensors=off", "--nvml-library", simNVML(),
		"--on-oom", dir, "--format", "json", "-o", filepath.Join(dir, "record.json"))
	c.waitEvent(logs.Attached, "kind", "oom_report")
	expect := w.run()
	if expect["result"] != 2 || expect["reserved"] != 20*MiB {
		t.Fatalf("workload: %v", expect)
	}
	r := s.report()
	free := uint64(88*MiB - 20*MiB - MiB) // the GPU less the segment and the context
	c.waitStderr(fmt.Sprintf("out of memory: pid %d (python3.12) asked 24.0 MiB through pytorch:out_of_memory on gpu 0: limit: "+
		"PyTorch's allocator refused 25165824 bytes without asking the driver, with %d free on the GPU: "+
		"a limit of its own (torch.cuda.set_per_process_memory_fraction)", w.pid, free))
	c.interrupt()
	breakdown.Fill(r, nil)
	if len(r.OOMs) != 1 {
		t.Fatalf("%d out-of-memory snapshots", len(r.OOMs))
	}
	if v := r.OOMs[0].Verdict; v.Verdict != snapshot.Limit || v.Asked != expect["requested"] || v.Free != free {
		t.Errorf("verdict %+v, want a limit of %d asked with %d free", v, expect["requested"], free)
	}
	// The report is probed at its entry: its stack starts at its caller.
	if f := r.OOMs[0].Failure.Frames; len(f) < 2 || f[1].Function != "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc" {
		t.Errorf("the out-of-memory's stack %v, want the allocator's malloc under the report", f)
	}
	w.exit()
}

// TestFragmentationVerdict: a process whose cache holds 32 MiB free, in
// blocks of 4 MiB, asks for 12 MiB with the driver full: the verdict is
// fragmentation, its figures the allocator's own free blocks, and it is
// the first words of record's out-of-memory line and in its JSON.
func TestFragmentationVerdict(t *testing.T) {
	dir := t.TempDir()
	s, w := startTensors(t, profiler.Config{Library: simLib, Tensors: profiler.TensorsAll}, pythons(t)[2], "fragment_oom", "SIMCUDA_CAPACITY="+strconv.Itoa(88*MiB))
	out := filepath.Join(dir, "record.json")
	c := startCLI(t, "record", "--pid", strconv.Itoa(w.pid), "--library", simLib, "--tensors", "--on-oom", dir, "--format", "json", "-o", out)
	c.waitEvent(logs.Attached, "kind", "allocator")
	expect := w.run()
	if expect["result"] != 2 || expect["reserved"] != 80*MiB || expect["inactive"] != 32*MiB || expect["largest_inactive"] != 4*MiB {
		t.Fatalf("workload: %v", expect)
	}
	r := s.report()
	c.waitStderr(fmt.Sprintf("out of memory: pid %d (python3.12) asked 12.0 MiB through cuMemAlloc_v2 on gpu 0: fragmentation: "+
		"PyTorch's cache held 33554432 bytes free, enough for the 12582912 asked, but its largest free block was 4194304 bytes", w.pid))
	c.interrupt()
	breakdown.Fill(r, nil)
	if len(r.OOMs) != 1 {
		t.Fatalf("%d out-of-memory snapshots", len(r.OOMs))
	}
	v := r.OOMs[0].Verdict
	frag := snapshot.Fragmentation{FreeInSegments: expect["inactive"], LargestFreeBlock: expect["largest_inactive"]}
	if v.Verdict != snapshot.FragmentationVerdict || v.Asked != expect["requested"] || v.Fragmentation == nil || *v.Fragmentation != frag {
		t.Errorf("verdict %+v, want fragmentation of %+v", v, frag)
	}
	if cache := v.Breakdown.Parts[0]; cache.Category != snapshot.Activations || cache.Bytes != 48*MiB {
		t.Errorf("the breakdown then: %+v, want 48 MiB of activations first", v.Breakdown.Parts)
	}
	var report struct {
		OOMs []struct {
			Verdict       string `json:"verdict"`
			Asked         uint64 `json:"asked_bytes"`
			Fragmentation struct {
				FreeInSegments   uint64 `json:"free_in_segments_bytes"`
				LargestFreeBlock uint64 `json:"largest_free_block_bytes"`
			} `json:"fragmentation"`
			Breakdown jsonBreakdown `json:"breakdown"`
		} `json:"out_of_memory"`
	}
	readJSON(t, out, &report)
	if len(report.OOMs) != 1 || report.OOMs[0].Verdict != "fragmentation" || report.OOMs[0].Asked != 12*MiB ||
		report.OOMs[0].Fragmentation.FreeInSegments != 32*MiB || report.OOMs[0].Fragmentation.LargestFreeBlock != 4*MiB ||
		report.OOMs[0].Breakdown.Bytes != 80*MiB {
		t.Errorf("record's out_of_memory: %+v", report.OOMs)
	}
	w.exit()
}

// breakdownOf is the breakdown of pid on gpu.
func breakdownOf(t *testing.T, bs []snapshot.Breakdown, pid int, gpu string) snapshot.Breakdown {
	t.Helper()
	for _, b := range bs {
		if b.PID == uint32(pid) && b.GPU == gpu {
			return b
		}
	}
	t.Fatalf("no breakdown of pid %d on gpu %s in %+v", pid, gpu, bs)
	return snapshot.Breakdown{}
}

// TestVerdictsFromNVML: the verdicts NVML decides, on a GPU of 200 MiB
// (the simulated NVML's total, SIMCUDA_CAPACITY of the profiler) with
// contexts of 1 MiB: a process holding 60 MiB and asking 60 more is
// refused by its driver (a capacity of its own) with 139 MiB free (a
// limit); beside a neighbour holding 100 MiB, with 38 MiB free (another
// process); a process holding 150 MiB of a driver of 200 asking 60
// (demand).
func TestVerdictsFromNVML(t *testing.T) {
	for _, c := range []struct {
		name      string
		capacity  int
		held      int
		neighbour int
		want      string
		why       string
	}{
		{"a limit", 100 * MiB, 60 * MiB, 0, snapshot.Limit, "the driver refused 62914560 bytes with 145752064 free on the GPU"},
		{"another process", 100 * MiB, 60 * MiB, 100 * MiB, snapshot.AnotherProcess, "other processes held the rest, the most pid %d (simwork) with 105906176"},
		{"demand", 200 * MiB, 150 * MiB, 0, snapshot.Demand, "the process held 158334976 bytes and asked 62914560 more of a GPU of 209715200"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := nvmlState(t, 1*MiB)
			t.Setenv("SIMCUDA_CAPACITY", strconv.Itoa(200*MiB)) // the GPU NVML reads
			var neighbour *workload
			if c.neighbour > 0 {
				neighbour = startWorkload(t, append(env, "SIMCUDA_CAPACITY="+strconv.Itoa(1<<30)), simwork, "hold", strconv.Itoa(c.neighbour))
				neighbour.run()
				c.why = fmt.Sprintf(c.why, neighbour.pid)
			}
			ooms := make(chan snapshot.OOM, 4)
			w := startWorkload(t, append(env, "SIMCUDA_CAPACITY="+strconv.Itoa(c.capacity)), simwork, "oom", strconv.Itoa(60*MiB), strconv.Itoa(c.held))
			s := startProfiler(t, profiler.Config{Library: simLib, NVML: simNVML(), OnOOM: func(o snapshot.OOM) { ooms <- o }}, w)
			s.waitEvent(logs.NVML, "driver", "simulated")
			if expect := w.run(); expect["result"] != 2 {
				t.Fatalf("workload: %v", expect)
			}
			o := <-ooms
			v := breakdown.Judge(&o, nil)
			if v.Verdict != c.want || !strings.Contains(v.Why, c.why) || v.Asked != 60*MiB {
				t.Errorf("verdict %s (%s), asked %d; want %s (%s)", v.Verdict, v.Why, v.Asked, c.want, c.why)
			}
			if parts := names(v.Breakdown); parts[snapshot.OtherDriver] != uint64(c.held) || v.Breakdown.Bytes() != uint64(c.held)+MiB {
				t.Errorf("the breakdown then: %v, want %d held and its 1 MiB context", parts, c.held)
			}
			w.exit()
			if neighbour != nil {
				neighbour.exit()
			}
		})
	}
}

func names(b snapshot.Breakdown) map[string]uint64 {
	m := map[string]uint64{}
	for _, p := range b.Parts {
		m[p.Name()] = p.Bytes
	}
	return m
}

// byNVMLPart names NVML's parts of a process (its contexts, modules and
// driver internals) as one, and any other part as itself.
func byNVMLPart(name string) string {
	switch name {
	case snapshot.Context, snapshot.Modules, snapshot.DriverInternal:
		return "nvml"
	}
	return name
}
