// The Tracer: loading program.bpf.c's object, and closing it.

package tracer

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/gpu-mem/gpu-mem/journal"
)

// ErrPermission is returned by New when the kernel refuses to load BPF.
var ErrPermission = errors.New("loading BPF programs needs root (CAP_BPF and CAP_PERFMON)")

// Options configure a Tracer.
type Options struct {
	// PIDs, when not empty, limits tracing to these processes, in BPF.
	PIDs []uint32
	// TensorNativeStacks walks the whole native stack of tensors allocated
	// from Python too, not only the allocator's frame.
	TensorNativeStacks bool
	// State, when set, has the maps and the driver's probes outlive the
	// Tracer, and its ring buffer's records journaled: the next Tracer
	// with the same State continues from them (Continued).
	State *State
}

// Tracer owns the loaded BPF program, its links and the ring buffer reader.
type Tracer struct {
	objs        objects
	ring        *ring
	readMu      sync.Mutex    // Read's, against Close's release of the ring
	batch       batch         // Read's
	carried     []byte        // Read's first event, when the journal carried counters
	flushesRead uint64        // Read's: the ring's flushes it answered
	idleWait    time.Duration // Read's: its last wait for records that did not come
	stacks      sentStacks    // Read's
	exit        []link.Link
	state       *State
	continued   Continued

	mu        sync.Mutex
	links     []link.Link
	usdtSites uint32                    // entries of usdt_sites in use
	sites     map[fileID]allocatorSites // by library file, under whatever path

	pythonMu         sync.Mutex // a change to python_procs and its generation's bump, in turn
	pythonGeneration uint64
}

// New loads the BPF program and starts watching process exits. Nothing is
// traced until Attach is called with a driver library.
func New(opts Options) (*Tracer, error) {
	return NewFromObject(_GpumemBytes, opts)
}

// NewFromObject is New with another build of program.bpf.c, such as the
// one in a gadget image.
func NewFromObject(object []byte, opts Options) (*Tracer, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPermission, err)
	}
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(object))
	if err != nil {
		return nil, fmt.Errorf("read BPF object: %w", err)
	}
	if err := checkObject(spec); err != nil {
		return nil, fmt.Errorf("not a gpu-mem object this gpumem can read: %w", err)
	}
	if opts.State == nil {
		return load(spec, opts)
	}
	if err := checkBPFFS(opts.State.PinPath); err != nil {
		return nil, err
	}
	pinMaps(spec)
	t, err := load(spec, opts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		// Maps pinned by a gpu-mem of another layout: theirs is dropped.
		refused := &journal.Refusal{Reason: "maps", Detail: fmt.Sprintf("the maps pinned at %s are not this gpu-mem's: %v", opts.State.PinPath, err)}
		if err := ClearState(opts.State.PinPath); err != nil {
			return nil, err
		}
		if t, err = load(spec, opts); err == nil {
			t.continued.Refused = refused
		}
	}
	if err != nil {
		return nil, err
	}
	if t.continued.Refused != nil {
		err = opts.State.Journal.Start(t.owner(object, opts))
	} else {
		t.continued, err = t.continueState(object, opts)
	}
	if err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// Continued says what the Tracer found of the state a predecessor left.
func (t *Tracer) Continued() Continued { return t.continued }

// objects are what gpumem loads of the object, named as bpf2go names
// them: the programs it attaches and the maps it reads or fills from user
// space. Loading assigns them and what they use, none of stock IG's
// per-function programs; an object without one of them (a gadget image
// built from another program.bpf.c) is refused at load.
type objects struct {
	GpumemEnter  *ebpf.Program `ebpf:"gpumem_enter"`
	GpumemLeave  *ebpf.Program `ebpf:"gpumem_leave"`
	GpumemExit   *ebpf.Program `ebpf:"gpumem_exit"`
	GpumemTensor *ebpf.Program `ebpf:"gpumem_tensor"`
	// PyTorch's checkpoint restores and raw frees, beside the tensor probes.
	GpumemRestoreEnter   *ebpf.Program `ebpf:"gpumem_restore_enter"`
	GpumemRestoreReturn  *ebpf.Program `ebpf:"gpumem_restore_return"`
	GpumemRawAllocEnter  *ebpf.Program `ebpf:"gpumem_raw_alloc_enter"`
	GpumemRawAllocReturn *ebpf.Program `ebpf:"gpumem_raw_alloc_return"`
	GpumemRawDelete      *ebpf.Program `ebpf:"gpumem_raw_delete"`
	// Its out-of-memory report, in libc10.so.
	GpumemTensorOom *ebpf.Program `ebpf:"gpumem_tensor_oom"`
	// The threads allocating to a CUDA graph's private pool.
	GpumemPoolBegin *ebpf.Program `ebpf:"gpumem_pool_begin"`
	GpumemPoolEnd   *ebpf.Program `ebpf:"gpumem_pool_end"`

	Events            *ebpf.Map `ebpf:"events"`
	DriverOff         *ebpf.Map `ebpf:"driver_off"`
	EventsLostSamples *ebpf.Map `ebpf:"events_lost_samples"`
	EventsLostBytes   *ebpf.Map `ebpf:"events_lost_bytes"`
	Inflight          *ebpf.Map `ebpf:"inflight"`
	Losses            *ebpf.Map `ebpf:"losses"`
	PythonProcs       *ebpf.Map `ebpf:"python_procs"`
	PythonGeneration  *ebpf.Map `ebpf:"python_generation"`
	ReaderAsleep      *ebpf.Map `ebpf:"reader_asleep"`
	TargetPids        *ebpf.Map `ebpf:"target_pids"`
	UsdtSites         *ebpf.Map `ebpf:"usdt_sites"`
}

// Close closes every program and map of o: each field, so that one added
// is closed too (a listed few once left two programs open).
func (o *objects) Close() error {
	var errs []error
	fields := reflect.ValueOf(o).Elem()
	for i := range fields.NumField() {
		errs = append(errs, fields.Field(i).Interface().(io.Closer).Close()) // nil when not loaded: a no-op
	}
	return errors.Join(errs...)
}

// checkObject makes sure an object has the event layout decode reads.
func checkObject(spec *ebpf.CollectionSpec) error {
	var event *btf.Struct
	if err := spec.Types.TypeByName("gpumem_event", &event); err != nil {
		return fmt.Errorf("no struct gpumem_event: %w", err)
	}
	if want := uint32(unsafe.Sizeof(gpumemGpumemEvent{})); event.Size != want {
		return fmt.Errorf("struct gpumem_event has %d bytes, this gpumem reads %d", event.Size, want)
	}
	return nil
}

// sized are the parts of the object load sizes or sets before loading, as
// bpf2go names them. Assign looks each up by its tag and fails on one the
// object lacks, so that a map or variable renamed in program.bpf.c stops
// the load instead of leaving it unsized.
type sized struct {
	// What only stock IG fills (the in-kernel totals and stack maps, and
	// gpumem_finish's tail calls): one entry each, should a program gpumem
	// loads refer to them.
	Stacks            *ebpf.MapSpec `ebpf:"stacks"`
	Allocations       *ebpf.MapSpec `ebpf:"allocations"`
	Processes         *ebpf.MapSpec `ebpf:"processes"`
	IgUstack          *ebpf.MapSpec `ebpf:"ig_ustack"`
	IgBuildId         *ebpf.MapSpec `ebpf:"ig_build_id"`
	Finishing         *ebpf.MapSpec `ebpf:"finishing"`
	FinishAllocations *ebpf.MapSpec `ebpf:"finish_allocations"`

	StackWindows *ebpf.MapSpec `ebpf:"stack_windows"` // an entry per CPU

	FilterPids         *ebpf.VariableSpec `ebpf:"filter_pids"`
	TensorNativeStacks *ebpf.VariableSpec `ebpf:"tensor_native_stacks"`
}

// load sizes the object's maps for gpumem, trimming what only stock IG
// uses, and loads gpumem's objects.
func load(spec *ebpf.CollectionSpec, opts Options) (*Tracer, error) {
	var s sized
	if err := spec.Assign(&s); err != nil {
		return nil, fmt.Errorf("size the maps: %w", err)
	}
	for _, m := range []*ebpf.MapSpec{s.Stacks, s.Allocations, s.Processes, s.IgUstack, s.IgBuildId, s.Finishing, s.FinishAllocations} {
		m.MaxEntries = 1
	}
	s.FinishAllocations.Contents = nil // gpumem_finish, trimmed above
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("size the stack windows: %w", err)
	}
	s.StackWindows.MaxEntries = uint32(cpus)
	if err := s.FilterPids.Set(len(opts.PIDs) > 0); err != nil {
		return nil, fmt.Errorf("set filter_pids: %w", err)
	}
	if err := s.TensorNativeStacks.Set(opts.TensorNativeStacks); err != nil {
		return nil, fmt.Errorf("set tensor_native_stacks: %w", err)
	}
	t := &Tracer{state: opts.State}
	var copts *ebpf.CollectionOptions
	if opts.State != nil {
		copts = &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: opts.State.mapsDir()}}
		if err := os.MkdirAll(opts.State.mapsDir(), 0o700); err != nil {
			return nil, fmt.Errorf("make pin directory: %w", err)
		}
	}
	if err := spec.LoadAndAssign(&t.objs, copts); err != nil {
		if errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("%w: %v", ErrPermission, err)
		}
		return nil, fmt.Errorf("load BPF program: %w", err)
	}
	if err := t.setup(opts); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

func (t *Tracer) setup(opts Options) error {
	for _, pid := range opts.PIDs {
		if err := t.objs.TargetPids.Put(pid, uint8(1)); err != nil {
			return fmt.Errorf("filter pid %d: %w", pid, err)
		}
	}
	// Past the generation a predecessor left (pinned), or to 1: threads'
	// storage starts at 0, never read.
	if err := t.objs.PythonGeneration.Lookup(uint32(0), &t.pythonGeneration); err != nil {
		return fmt.Errorf("read python_generation: %w", err)
	}
	if err := t.bumpPythonGeneration(); err != nil {
		return err
	}
	if err := t.attachExit(); err != nil {
		return err
	}
	var err error
	if t.ring, err = openRing(t.objs.Events); err != nil {
		return fmt.Errorf("open ring buffer: %w", err)
	}
	return nil
}

// attachExit has process exits reported, through a pinned link of a
// predecessor's if it left one.
func (t *Tracer) attachExit() error {
	var err error
	t.exit, err = t.pinned("exit", func() ([]link.Link, error) {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{
			Name:    "sched_process_exit",
			Program: t.objs.GpumemExit,
		})
		if err != nil {
			return nil, fmt.Errorf("attach sched_process_exit: %w", err)
		}
		return []link.Link{l}, nil
	})
	return err
}

// owner is what the journal of this tracer's state says of it.
func (t *Tracer) owner(object []byte, opts Options) journal.Owner {
	boot, _ := bootID()
	info, _ := t.objs.Events.Info()
	ring, _ := info.ID()
	return journal.Owner{Object: objectSum(object, opts), Boot: boot, Ring: uint32(ring)}
}

// Close detaches every probe and frees the BPF objects, but those of its
// State, pinned: they stay for the next Tracer.
func (t *Tracer) Close() error {
	t.mu.Lock()
	closeAll(t.links)
	t.links = nil
	t.mu.Unlock()
	closeAll(t.exit)
	t.exit = nil
	if t.ring != nil {
		t.ring.close()
		t.readMu.Lock()
		t.ring.release()
		t.readMu.Unlock()
	}
	t.objs.Close()
	return nil
}

func closeAll(links []link.Link) {
	for _, l := range links {
		l.Close()
	}
}
