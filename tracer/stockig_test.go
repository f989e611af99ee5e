package tracer

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// TestStockIGPath loads the whole object the way stock Inspektor Gadget
// does (every program, aggregate and collect_ustack on), attaches its
// per-function uprobes as IG's uprobe tracer would, and checks the in-kernel
// totals that IG's map iterators read, byte for byte.
func TestStockIGPath(t *testing.T) {
	spec, coll, lib := loadStockIG(t)
	attachPerFunction(t, spec, coll, lib)
	checkKinds(t, coll, lib)
}

// TestStockIGSweepsExitedAllocations fills the allocations map with those
// of a process that exited (the exit hook leaves them): the next
// allocation sweeps them out and is charged, nothing lost.
func TestStockIGSweepsExitedAllocations(t *testing.T) {
	spec, coll, lib := loadStockIG(t)
	m := coll.Maps["allocations"]
	const gone = 1 << 30 // above any pid
	keys := make([]gpumemGpumemAllocationKey, m.MaxEntries())
	values := make([]gpumemGpumemAllocation, len(keys))
	for i := range keys {
		keys[i] = gpumemGpumemAllocationKey{Pid: gone, Address: uint64(i + 1)}
		values[i] = gpumemGpumemAllocation{Bytes: 1, Started: 1}
	}
	if n, err := m.BatchUpdate(keys, values, nil); err != nil || n != len(keys) {
		t.Fatalf("fill allocations: %d of %d: %v", n, len(keys), err)
	}
	attachPerFunction(t, spec, coll, lib)
	checkKinds(t, coll, lib)
	var (
		key   gpumemGpumemAllocationKey
		value gpumemGpumemAllocation
		stale int
	)
	for it := m.Iterate(); it.Next(&key, &value); {
		if key.Pid == gone {
			stale++
		}
	}
	if stale != 0 {
		t.Errorf("%d allocations of the exited process left", stale)
	}
}

// loadStockIG loads the object as stock IG does, with the simulated driver
// it will be attached to: a copy of its own, which only startKinds's
// processes load, so that the uprobes on it count no other test's calls
// (packages' tests run side by side, and a sweep of the allocations map
// that another process's allocations race can leave stale entries).
func loadStockIG(t *testing.T) (*ebpf.CollectionSpec, *ebpf.Collection, string) {
	if os.Geteuid() != 0 {
		t.Fatal("loads BPF: run as root")
	}
	root, _ := filepath.Abs("..")
	if out, err := exec.Command("make", "-s", "-C", root, "sim").CombinedOutput(); err != nil {
		t.Fatalf("make sim: %v\n%s", err, out)
	}
	lib := filepath.Join(t.TempDir(), "libcuda.so.1")
	if out, err := exec.Command("cp", filepath.Join(root, "build/sim/libcuda.so.1"), lib).CombinedOutput(); err != nil {
		t.Fatalf("copy the simulated driver: %v\n%s", err, out)
	}

	spec, err := loadGpumem()
	if err != nil {
		t.Fatal(err)
	}
	spec.Maps["ig_build_id"].MaxEntries = 1024 // IG sizes it at run time
	for name, value := range map[string]bool{"aggregate": true, "collect_ustack": true} {
		if err := spec.Variables[name].Set(value); err != nil {
			t.Fatalf("set %s: %v", name, err)
		}
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		t.Fatalf("load every program: %+v", err)
	}
	t.Cleanup(coll.Close)
	return spec, coll, lib
}

// checkKinds runs simwork's kinds scenario on the driver lib and checks the
// totals of its process, then that its exit drops them.
func checkKinds(t *testing.T, coll *ebpf.Collection, lib string) {
	w, stdin := startKinds(t, lib)
	defer w.Process.Kill()
	stdin.run()
	pid := uint32(w.Process.Pid)

	const MiB = 1 << 20
	// Every allocation of the kinds scenario (tests/tracer_test.go lists
	// them) plus the one it makes before it starts, which it frees later.
	allocated := 11*MiB + 354304 + 12345
	freed := 3*MiB + 122880 + 12345
	var proc gpumemGpumemProcess
	if err := coll.Maps["processes"].Lookup(gpumemGpumemProcessKey{Pid: pid}, &proc); err != nil {
		t.Fatalf("processes[%d]: %v", pid, err)
	}
	if proc.AllocBytes != uint64(allocated) || proc.AllocCount != 15 || proc.LiveBytes != uint64(allocated-freed) ||
		proc.FreeCount != 7 || proc.FailedCount != 0 {
		t.Errorf("process totals %+v, want %d bytes in 15 allocations, %d live, 7 frees", proc, allocated, allocated-freed)
	}
	for _, loss := range []gpumemGpumemLoss{gpumemGpumemLossGPUMEM_LOSS_AGGREGATE_FULL, gpumemGpumemLossGPUMEM_LOSS_UNFINISHED,
		gpumemGpumemLossGPUMEM_LOSS_SCRATCH_BUSY} {
		if lost, err := sumPerCPU(coll.Maps["losses"], uint32(loss)); err != nil || lost != 0 {
			t.Errorf("loss %d: %d (%v)", loss, lost, err)
		}
	}
	unavailable, err := sumPerCPU(coll.Maps["losses"], uint32(gpumemGpumemLossGPUMEM_LOSS_STACK_UNAVAILABLE))
	if err != nil {
		t.Fatal(err)
	}
	if mntns := mountNamespace(t, int(pid)); proc.Proc.MntnsId != mntns {
		t.Errorf("mount namespace %d, want %d", proc.Proc.MntnsId, mntns)
	}

	var (
		key   gpumemGpumemStackKey
		stack gpumemGpumemStack
		sum   gpumemGpumemStack
		three []gpumemGpumemStack
	)
	it := coll.Maps["stacks"].Iterate()
	for it.Next(&key, &stack) {
		if key.Pid != pid {
			continue
		}
		if key.StackId != stack.UstackRaw.StackId || stack.Proc.Pid != pid {
			t.Errorf("stack %+v holds %+v", key, stack)
		}
		// Stack ID 0 holds the allocations whose stack ig_ustack refused
		// (a bucket collision: other processes' stacks share the map).
		frames := make([]uint64, 127)
		if key.StackId == 0 && unavailable == 0 {
			t.Errorf("stack ID 0 without a stack counted unavailable: %+v", stack)
		} else if err := coll.Maps["ig_ustack"].Lookup(key.StackId, &frames); key.StackId != 0 && err != nil {
			t.Errorf("stack %d not in ig_ustack: %v", key.StackId, err)
		}
		sum.AllocBytes += stack.AllocBytes
		sum.AllocCount += stack.AllocCount
		sum.LiveBytes += stack.LiveBytes
		sum.LiveCount += stack.LiveCount
		if stack.AllocCount == 3 {
			three = append(three, stack)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if sum.AllocBytes != uint64(allocated) || sum.AllocCount != 15 || sum.LiveBytes != uint64(allocated-freed) || sum.LiveCount != 8 {
		t.Errorf("stacks sum to %+v", sum)
	}
	// alloc_device: three cuMemAlloc_v2 of 1 MiB in a loop, one stack, one freed.
	if len(three) != 1 || three[0].AllocBytes != 3*MiB || three[0].LiveBytes != 2*MiB || three[0].LiveCount != 2 {
		t.Errorf("alloc_device's stack: %+v", three)
	}

	// Its primary context, on device 0, keyed by the process.
	if devices := contextDevices(t, coll, pid); len(devices) != 1 || devices[0] != 0 {
		t.Errorf("context devices of the process: %v, want its primary context's, 0", devices)
	}

	stdin.stdin.Close()
	if err := w.Wait(); err != nil {
		t.Fatal(err)
	}
	// The exit hook drops the process from every aggregate map.
	deadline := time.Now().Add(time.Minute) // bounds a hang only
	for coll.Maps["processes"].Lookup(gpumemGpumemProcessKey{Pid: pid}, &proc) == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := coll.Maps["processes"].Lookup(gpumemGpumemProcessKey{Pid: pid}, &proc); err == nil {
		t.Errorf("exited process still in processes: %+v", proc)
	}
	it = coll.Maps["stacks"].Iterate()
	for it.Next(&key, &stack) {
		if key.Pid == pid {
			t.Errorf("exited process still has stack %+v", key)
		}
	}
	// And its contexts: a primary context is never destroyed, and each
	// exited process's would stay until the map was full.
	if devices := contextDevices(t, coll, pid); len(devices) != 0 {
		t.Errorf("exited process still has contexts on devices %v", devices)
	}
}

// kindsInput is the kinds scenario's stdin and stdout.
type kindsInput struct {
	stdin io.WriteCloser
	lines *bufio.Scanner
}

// startKinds starts simwork's kinds scenario on the driver lib, which
// waits, ready, after an allocation the probes see too, for kindsInput.run.
func startKinds(t *testing.T, lib string) (*exec.Cmd, kindsInput) {
	t.Helper()
	root, _ := filepath.Abs("..")
	w := exec.Command(filepath.Join(root, "build/sim/simwork"), "kinds")
	w.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Dir(lib)) // before simwork's RUNPATH
	stdin, _ := w.StdinPipe()
	stdout, _ := w.StdoutPipe()
	w.Stderr = os.Stderr
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	in := kindsInput{stdin, bufio.NewScanner(stdout)}
	in.lines.Scan() // "ready PID"
	return w, in
}

// run runs the scenario's allocations and frees, and returns when they are
// done; the process exits when stdin is closed.
func (in kindsInput) run() {
	fmt.Fprintln(in.stdin)
	for in.lines.Scan() && !strings.HasPrefix(in.lines.Text(), "expect") {
	}
}

// contextDevices are the devices of a process's contexts in
// context_devices.
func contextDevices(t *testing.T, coll *ebpf.Collection, pid uint32) []int32 {
	t.Helper()
	var (
		key struct {
			Pid, Pad uint32
			Ctx      uint64
		}
		device  int32
		devices []int32
	)
	it := coll.Maps["context_devices"].Iterate()
	for it.Next(&key, &device) {
		if key.Pid == pid {
			devices = append(devices, device)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return devices
}

// attachPerFunction attaches the uprobe/libcuda:SYMBOL and
// uretprobe/libcuda:SYMBOL programs one by one, as IG does, and the exit
// hook. Frees have no return program.
func attachPerFunction(t *testing.T, spec *ebpf.CollectionSpec, coll *ebpf.Collection, lib string) {
	ex, err := link.OpenExecutable(lib)
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range spec.Programs {
		kind, symbol, ok := strings.Cut(p.SectionName, "/libcuda:")
		if !ok {
			continue
		}
		attach := ex.Uprobe
		if kind == "uretprobe" {
			attach = ex.Uretprobe
		}
		l, err := attach(symbol, coll.Programs[name], nil)
		if err != nil {
			t.Fatalf("%s %s: %v", kind, symbol, err)
		}
		t.Cleanup(func() { l.Close() })
	}
	exit, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "sched_process_exit", Program: coll.Programs["gpumem_exit"]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exit.Close() })
}

func mountNamespace(t *testing.T, pid int) uint64 {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/mnt", pid), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
