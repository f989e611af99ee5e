package tracer

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/gpu-mem/gpu-mem/schema"
)

// Each test here puts the BPF side in a state a busy node reaches (a full
// map, a scratch event in use, a call nested too deep) and checks that
// what it could not deliver is counted under its own reason, exactly.

// kindsAllocations and kindsFrees are the driver calls simwork's kinds
// scenario makes once running (tests/workloads/simwork.c): frees reach the
// ring buffer at their entry, with no scratch and no call in flight.
const (
	kindsAllocations = 14
	kindsFrees       = 8
)

func TestScratchHeldElsewhere(t *testing.T) {
	w := startTraced(t, nil, "kinds")
	users := make([]uint64, ebpf.MustPossibleCPU())
	for i := range users {
		users[i] = 1 // as if a preempted program held every CPU's scratch
	}
	if err := loadedMap(t, w.tr, "scratch_users").Put(uint32(0), users); err != nil {
		t.Fatal(err)
	}
	events := w.run(t)
	w.expect(t, events, 0, kindsFrees, schema.Losses{schema.ScratchBusy: kindsAllocations})
}

func TestNestedTooDeep(t *testing.T) {
	w := startTraced(t, nil, "kinds")
	pid := uint64(w.cmd.Process.Pid)
	if err := w.tr.objs.Inflight.Put(pid<<32|pid, gpumemGpumemCalls{Depth: 4}); err != nil {
		t.Fatal(err)
	}
	events := w.run(t)
	w.expect(t, events, 0, kindsFrees, schema.Losses{schema.NestedTooDeep: kindsAllocations})
}

func TestInflightFull(t *testing.T) {
	w := startTraced(t, nil, "kinds")
	fill(t, w.tr.objs.Inflight, func(i uint32) (uint64, gpumemGpumemCalls) {
		return uint64(1)<<62 | uint64(i), gpumemGpumemCalls{}
	})
	events := w.run(t)
	w.expect(t, events, 0, kindsFrees, schema.Losses{schema.InflightFull: kindsAllocations})
}

// TestContextsFull: each of two threads makes its context current first;
// with no room for its stack of contexts, each change is counted.
func TestContextsFull(t *testing.T) {
	w := startTraced(t, nil, "threads", "2", "0.05")
	fill(t, loadedMap(t, w.tr, "thread_contexts"), func(i uint32) (uint32, gpumemGpumemCtxStack) {
		return 1<<30 | i, gpumemGpumemCtxStack{}
	})
	events := w.run(t)
	w.expect(t, events, w.expected(t, "allocs"), w.expected(t, "frees"), schema.Losses{schema.ContextsFull: 2})
}

// TestTensorArgUnreadable points every tensor probe's first argument at
// memory that cannot be read: each tensor event is dropped and counted,
// where it used to enter a tensor at address 0.
func TestTensorArgUnreadable(t *testing.T) {
	clean := startTensors(t)
	tensors := len(clean.run(t))
	if tensors == 0 {
		t.Fatal("no tensor events")
	}

	w := startTensors(t)
	var site gpumemGpumemUsdtSite
	for i := range w.tr.usdtSites {
		m := w.tr.objs.UsdtSites
		if err := m.Lookup(i, &site); err != nil {
			t.Fatal(err)
		}
		site.Args[0].Kind = uint8(gpumemGpumemUsdtArgKindGPUMEM_USDT_MEMORY)
		site.Args[0].Value = 1 << 62 // not a user address
		if err := m.Put(i, site); err != nil {
			t.Fatal(err)
		}
	}
	events := w.run(t)
	w.expect(t, events, 0, 0, schema.Losses{schema.TensorArgUnreadable: uint64(tensors)})
}

func TestNativeStackTruncated(t *testing.T) {
	for depth, truncated := range map[int]bool{20: false, 200: true} {
		t.Run(fmt.Sprint(depth), func(t *testing.T) {
			w := startTraced(t, nil, "deep", fmt.Sprint(depth))
			events := w.run(t)
			w.expect(t, events, 1, 0, schema.Losses{})
			ev := events[0]
			if got := ev.Flags&NativeTruncated != 0; got != truncated {
				t.Errorf("truncated %t, want %t (flags %#x)", got, truncated, ev.Flags)
			}
			if truncated && len(ev.Stack) != 127 || !truncated && len(ev.Stack) < depth {
				t.Errorf("%d frames", len(ev.Stack))
			}
		})
	}
}

// traced is a workload traced alone by its own tracer, stopped at ready.
type traced struct {
	tr         *Tracer
	cmd        *exec.Cmd
	stdin      io.WriteCloser
	lines      *bufio.Scanner
	expectLine string
}

// startTraced starts `simwork ARGS...` on the simulated driver and a
// tracer of it alone.
func startTraced(t *testing.T, env []string, args ...string) *traced {
	root := buildSim(t)
	return start(t, exec.Command(filepath.Join(root, "build/sim/simwork"), args...), env, "")
}

// startTensors starts simwork.py's tensors scenario on the simulated driver
// and PyTorch allocator, traced with the allocator's probes.
func startTensors(t *testing.T) *traced {
	root := buildSim(t)
	allocator := filepath.Join(root, "build/sim/libc10_cuda.so")
	cmd := exec.Command("python3", filepath.Join(root, "tests/workloads/simwork.py"), "tensors")
	return start(t, cmd, []string{"SIMCUDA_LIB=" + filepath.Join(root, "build/sim/libcuda.so.1"), "SIMTORCH_LIB=" + allocator}, allocator)
}

func buildSim(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("loads BPF: run as root")
	}
	root, _ := filepath.Abs("..")
	if out, err := exec.Command("make", "-s", "-C", root, "sim").CombinedOutput(); err != nil {
		t.Fatalf("make sim: %v\n%s", err, out)
	}
	return root
}

func start(t *testing.T, cmd *exec.Cmd, env []string, allocator string) *traced {
	t.Helper()
	w := &traced{cmd: cmd}
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	w.stdin, _ = cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	w.lines = bufio.NewScanner(stdout)
	if !w.lines.Scan() || !strings.HasPrefix(w.lines.Text(), "ready") {
		t.Fatalf("%v: %q, want ready", cmd.Args, w.lines.Text())
	}
	var err error
	if w.tr, err = New(Options{PIDs: []uint32{uint32(cmd.Process.Pid)}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.tr.Close() })
	if allocator != "" {
		l, err := w.tr.AttachAllocator(allocator, uint32(cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return w
	}
	// The driver the workload runs: the copy beside simwork, or SIMCUDA_LIB.
	lib := filepath.Join(filepath.Dir(cmd.Path), "libcuda.so.1")
	if _, err := w.tr.Attach(lib); err != nil {
		t.Fatal(err)
	}
	return w
}

// run lets the workload go and returns every event it caused, once it said
// what it expects.
func (w *traced) run(t *testing.T) []Event {
	t.Helper()
	fmt.Fprintln(w.stdin)
	for w.lines.Scan() {
		if strings.HasPrefix(w.lines.Text(), "expect") {
			w.expectLine = w.lines.Text()
			break
		}
	}
	if w.expectLine == "" {
		t.Fatalf("%v ended without its expect line", w.cmd.Args)
	}
	if err := w.tr.Flush(); err != nil {
		t.Fatal(err)
	}
	var events []Event
	for {
		var ev Event
		err := w.tr.Read(&ev)
		if errors.Is(err, ringbuf.ErrFlushed) {
			return events
		}
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, ev)
	}
}

// expected is a number of the workload's expect line.
func (w *traced) expected(t *testing.T, key string) int {
	t.Helper()
	for _, field := range strings.Fields(w.expectLine)[1:] {
		if k, v, _ := strings.Cut(field, "="); k == key {
			var n int
			if _, err := fmt.Sscan(v, &n); err != nil {
				t.Fatalf("%s: %v", field, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in %q", key, w.expectLine)
	return 0
}

// expect checks the events' counts and every loss counter.
func (w *traced) expect(t *testing.T, events []Event, allocs, frees int, losses schema.Losses) {
	t.Helper()
	gotAllocs, gotFrees := 0, 0
	for _, ev := range events {
		if ev.Op.IsFree() {
			gotFrees++
		} else {
			gotAllocs++
		}
	}
	if gotAllocs != allocs || gotFrees != frees {
		t.Errorf("%d allocation and %d free events, want %d and %d", gotAllocs, gotFrees, allocs, frees)
	}
	got, err := w.tr.Losses()
	if err != nil {
		t.Fatal(err)
	}
	if got != losses {
		t.Errorf("losses %v, want %v", got, losses)
	}
}

// fill puts entries made by entry into m until it is full.
func fill[K, V any](t *testing.T, m *ebpf.Map, entry func(uint32) (K, V)) {
	t.Helper()
	keys := make([]K, m.MaxEntries())
	values := make([]V, len(keys))
	for i := range keys {
		keys[i], values[i] = entry(uint32(i))
	}
	if n, err := m.BatchUpdate(keys, values, nil); err != nil || n != len(keys) {
		t.Fatalf("fill %s: %d of %d: %v", m, n, len(keys), err)
	}
}

// TestContextsDroppedAtExit: the contexts a process made, and their
// devices, go when it exits, without a walk of the map (the soak found
// context_devices holding one entry per process that ever made one).
func TestContextsDroppedAtExit(t *testing.T) {
	w := startTraced(t, []string{"SIMCUDA_DEVICES=3"}, "devices")
	pid := uint32(w.cmd.Process.Pid)
	w.run(t)
	contexts := func() (n int) {
		var (
			key gpumemGpumemContextKey
			dev int32
		)
		for it := loadedMap(t, w.tr, "context_devices").Iterate(); it.Next(&key, &dev); {
			if key.Pid == pid {
				n++
			}
		}
		return n
	}
	if n := contexts(); n < 3 {
		t.Fatalf("%d contexts of the process, want one per device at least", n)
	}
	w.stdin.Close()
	if err := w.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	var list gpumemGpumemProcessContexts
	if n, err := contexts(), loadedMap(t, w.tr, "process_contexts").Lookup(pid, &list); n != 0 || err == nil {
		t.Errorf("after the exit: %d contexts, list %+v (%v)", n, list, err)
	}
}

// TestAllocatorSitesStoredOnce: a library's USDT sites take their entries
// of usdt_sites once, however many processes, through however many paths
// (/proc/PID/root/... is each process's own), its probes are attached for:
// switching tensor views on and off again never runs out of entries.
func TestAllocatorSitesStoredOnce(t *testing.T) {
	root := buildSim(t)
	allocator := filepath.Join(root, "build/sim/libc10_cuda.so")
	tr, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	paths := []string{allocator, "/proc/self/root" + allocator, fmt.Sprintf("/proc/%d/root%s", os.Getpid(), allocator)}
	max := int(tr.objs.UsdtSites.MaxEntries())
	var sites int
	for i := range max {
		p, err := tr.AttachAllocator(paths[i%len(paths)], uint32(os.Getpid()))
		if err != nil {
			t.Fatalf("attach %d: %v", i, err)
		}
		p.Close()
		sites = p.Sites
	}
	if int(tr.usdtSites) != sites {
		t.Errorf("usdt_sites holds %d entries for a library of %d sites", tr.usdtSites, sites)
	}
}

// loadedMap is a map the tracer's programs use that it keeps no handle on,
// found through the programs' map IDs. The kernel keeps 15 bytes of a name.
func loadedMap(t *testing.T, tr *Tracer, name string) *ebpf.Map {
	t.Helper()
	for _, prog := range []*ebpf.Program{tr.objs.GpumemEnter, tr.objs.GpumemLeave, tr.objs.GpumemExit, tr.objs.GpumemTensor} {
		info, err := prog.Info()
		if err != nil {
			t.Fatal(err)
		}
		ids, _ := info.MapIDs()
		for _, id := range ids {
			m, err := ebpf.NewMapFromID(id)
			if err != nil {
				t.Fatal(err)
			}
			if mi, err := m.Info(); err == nil && mi.Name == name[:min(len(name), 15)] {
				t.Cleanup(func() { m.Close() })
				return m
			}
			m.Close()
		}
	}
	t.Fatalf("no map %s in the programs loaded", name)
	return nil
}
