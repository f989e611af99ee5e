package tracer

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/arch/x86/x86asm"
	"golang.org/x/sys/unix"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/usdt"
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
}

// Tracer owns the loaded BPF program, its links and the ring buffer reader.
type Tracer struct {
	objs   objects
	reader *ringbuf.Reader
	record ringbuf.Record // Read's, reused
	stacks sentStacks     // Read's
	exit   link.Link

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
	return load(spec, opts)
}

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
	// The threads allocating to a CUDA graph's private pool.
	GpumemPoolBegin *ebpf.Program `ebpf:"gpumem_pool_begin"`
	GpumemPoolEnd   *ebpf.Program `ebpf:"gpumem_pool_end"`

	Events            *ebpf.Map `ebpf:"events"`
	DriverOff         *ebpf.Map `ebpf:"driver_off"`
	EventsLostSamples *ebpf.Map `ebpf:"events_lost_samples"`
	Inflight          *ebpf.Map `ebpf:"inflight"`
	Losses            *ebpf.Map `ebpf:"losses"`
	PythonProcs       *ebpf.Map `ebpf:"python_procs"`
	PythonGeneration  *ebpf.Map `ebpf:"python_generation"`
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

// load trims what only stock IG uses (the in-kernel totals and stack
// maps, left at one entry, should a program gpumem loads refer to them) and
// loads gpumem's objects.
func load(spec *ebpf.CollectionSpec, opts Options) (*Tracer, error) {
	for _, name := range []string{"stacks", "allocations", "processes", "ig_ustack", "ig_build_id", "finishing", "finish_allocations"} {
		if m := spec.Maps[name]; m != nil {
			m.MaxEntries = 1
		}
	}
	if m := spec.Maps["finish_allocations"]; m != nil {
		m.Contents = nil // gpumem_finish, trimmed above
	}
	if m := spec.Maps["stack_windows"]; m != nil {
		cpus, err := ebpf.PossibleCPU()
		if err != nil {
			return nil, fmt.Errorf("size the stack windows: %w", err)
		}
		m.MaxEntries = uint32(cpus) // an entry per CPU
	}
	for name, on := range map[string]bool{"filter_pids": len(opts.PIDs) > 0, "tensor_native_stacks": opts.TensorNativeStacks} {
		if !on {
			continue // the default, also in objects built before the variable
		}
		if v := spec.Variables[name]; v == nil {
			return nil, fmt.Errorf("set %s: no such variable in this object", name)
		} else if err := v.Set(true); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	t := &Tracer{}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
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
	if err := t.bumpPythonGeneration(); err != nil { // to 1: threads' storage starts at 0, never read
		return err
	}
	var err error
	t.exit, err = link.AttachRawTracepoint(link.RawTracepointOptions{
		Name:    "sched_process_exit",
		Program: t.objs.GpumemExit,
	})
	if err != nil {
		return fmt.Errorf("attach sched_process_exit: %w", err)
	}
	t.reader, err = ringbuf.NewReader(t.objs.Events)
	if err != nil {
		return fmt.Errorf("open ring buffer: %w", err)
	}
	t.reader.SetDeadline(time.Now().Add(pollInterval))
	return nil
}

// Attach puts the entry probes on every driver function that the library
// at path exports, and return probes on all but the frees, which are
// reported at their entry (one trap fewer per free). It returns the
// functions it found. Symbols a driver version lacks (the _ptsz variants,
// say) are skipped; a library exporting none of them is an error.
func (t *Tracer) Attach(path string) ([]string, error) {
	symbols, cookies, err := DriverFunctions(path)
	if err != nil {
		return nil, err
	}
	ex, err := link.OpenExecutable(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	enter, err := ex.UprobeMulti(symbols, t.objs.GpumemEnter, &link.UprobeMultiOptions{Cookies: cookies})
	if err != nil {
		return nil, fmt.Errorf("attach entry probes to %s: %w", path, err)
	}
	links := []link.Link{enter}
	if returning, returnCookies := withoutFrees(symbols, cookies); len(returning) > 0 {
		leave, err := ex.UretprobeMulti(returning, t.objs.GpumemLeave, &link.UprobeMultiOptions{Cookies: returnCookies})
		if err != nil {
			enter.Close()
			return nil, fmt.Errorf("attach return probes to %s: %w", path, err)
		}
		links = append(links, leave)
	}
	t.mu.Lock()
	t.links = append(t.links, links...)
	t.mu.Unlock()
	return symbols, nil
}

// withoutFrees keeps the functions whose return is probed.
func withoutFrees(symbols []string, cookies []uint64) ([]string, []uint64) {
	var s []string
	var c []uint64
	for i, op := range cookies {
		if !memory.Op(op).IsFree() {
			s, c = append(s, symbols[i]), append(c, op)
		}
	}
	return s, c
}

// ErrNoProbes is returned by AttachAllocator for a library without
// PyTorch's USDT probes (a torch built without them).
var ErrNoProbes = errors.New("no pytorch:malloc or pytorch:free USDT probes")

// allocatorSites are one library's USDT sites, stored in usdt_sites once
// however many processes they are attached for, through whatever path
// (/proc/PID/root/... differs from process to process).
type allocatorSites struct {
	addrs, refs, cookies []uint64
	functions            map[string]allocatorFunction // the allocator's own functions probed, by name
}

// fileID is a file's device and inode.
type fileID struct{ dev, ino uint64 }

// AllocatorProbes are the probes on one allocator library, for one process
// or for all; Close detaches them.
type AllocatorProbes struct {
	Sites int // USDT sites probed
	// Missing are the allocator's own functions the library lacks, whose
	// changes to the books pass no USDT site and are not followed
	// (docs/pytorch-allocator-books.md), or, for beginAllocateToPool and
	// endAllocateToPool, graphs' pools are not told from the cache: none in
	// torch 2.1 and later.
	Missing []string
	links   []link.Link
}

// Close detaches the probes.
func (p *AllocatorProbes) Close() error {
	closeAll(p.links)
	return nil
}

// AttachAllocator puts probes on the USDT sites of PyTorch's caching
// allocator in the library at path (libc10_cuda.so): every tensor allocated
// and freed, in process pid only, or in every process that maps the library
// when pid is 0. The kernel counts the probes in their semaphores, which
// turns them on, and inserts their traps, only in the processes they are
// attached for: the others pay nothing. Beside them, probes on the
// allocator's own functions, found by name in the library's symbol
// tables, follow the restores and raw frees that pass no USDT site, and the
// threads allocating to a CUDA graph's private pool (tracer.GraphPool). Closing the
// probes detaches them, as closing the tracer does not.
func (t *Tracer) AttachAllocator(path string, pid uint32) (*AllocatorProbes, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sites, err := t.allocatorSites(path)
	if err != nil {
		return nil, err
	}
	ex, err := link.OpenExecutable(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	l, err := ex.UprobeMulti(nil, t.objs.GpumemTensor, &link.UprobeMultiOptions{
		Addresses: sites.addrs, RefCtrOffsets: sites.refs, Cookies: sites.cookies, PID: pid})
	if err != nil {
		return nil, fmt.Errorf("attach USDT probes to %s: %w", path, err)
	}
	p := &AllocatorProbes{Sites: len(sites.addrs), links: []link.Link{l}}
	for _, f := range []struct {
		name         string
		enter, leave *ebpf.Program
	}{
		{restoreFunction, t.objs.GpumemRestoreEnter, t.objs.GpumemRestoreReturn},
		{rawAllocFunction, t.objs.GpumemRawAllocEnter, t.objs.GpumemRawAllocReturn},
		{rawAllocStreamFunction, t.objs.GpumemRawAllocEnter, t.objs.GpumemRawAllocReturn},
		{rawDeleteFunction, t.objs.GpumemRawDelete, nil},
		{poolBeginFunction, t.objs.GpumemPoolBegin, nil},
		{poolEndFunction, t.objs.GpumemPoolEnd, nil},
	} {
		fn, ok := sites.functions[f.name]
		if !ok || f.leave != nil && len(fn.returns) == 0 {
			p.Missing = append(p.Missing, f.name)
			continue
		}
		if err := p.attach(ex, fn, f.enter, f.leave, pid); err != nil {
			p.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return p, nil
}

// attach puts enter on the function's entry and, unless nil, leave on its
// return instructions.
func (p *AllocatorProbes) attach(ex *link.Executable, fn allocatorFunction, enter, leave *ebpf.Program, pid uint32) error {
	l, err := ex.UprobeMulti([]string{fn.symbol}, enter, &link.UprobeMultiOptions{PID: pid})
	if err != nil {
		return fmt.Errorf("attach %s: %w", fn.symbol, err)
	}
	p.links = append(p.links, l)
	if leave == nil {
		return nil
	}
	symbols := make([]string, len(fn.returns))
	for i := range symbols {
		symbols[i] = fn.symbol
	}
	if l, err = ex.UprobeMulti(symbols, leave, &link.UprobeMultiOptions{Offsets: fn.returns, PID: pid}); err != nil {
		return fmt.Errorf("attach the returns of %s: %w", fn.symbol, err)
	}
	p.links = append(p.links, l)
	return nil
}

// The allocator's own functions probed beside its USDT sites, by their C++
// names; their mangled names begin with the prefixes below, whatever
// their parameters (c10::DeviceIndex was an int before torch 2.2).
const (
	restoreFunction        = "NativeCachingAllocator::setCheckpointPoolState"
	rawAllocFunction       = "NativeCachingAllocator::raw_alloc"
	rawAllocStreamFunction = "NativeCachingAllocator::raw_alloc_with_stream"
	rawDeleteFunction      = "NativeCachingAllocator::raw_delete"
	poolBeginFunction      = "NativeCachingAllocator::beginAllocateToPool"
	poolEndFunction        = "NativeCachingAllocator::endAllocateToPool"
)

const nativeAllocator = "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator"

// A function may have had another name: torch 2.1 began and ended
// allocating to a pool per stream (beginAllocateStreamToPool(device,
// stream, pool), endAllocateStreamToPool(device, stream)), 2.2 on per
// filter (pytorch#114647); the probes read neither's arguments.
var functionPrefixes = map[string][]string{
	restoreFunction:        {nativeAllocator + "22setCheckpointPoolStateE"},
	rawAllocFunction:       {nativeAllocator + "9raw_allocE"},
	rawAllocStreamFunction: {nativeAllocator + "21raw_alloc_with_streamE"},
	rawDeleteFunction:      {nativeAllocator + "10raw_deleteE"},
	poolBeginFunction:      {nativeAllocator + "19beginAllocateToPoolE", nativeAllocator + "25beginAllocateStreamToPoolE"},
	poolEndFunction:        {nativeAllocator + "17endAllocateToPoolE", nativeAllocator + "23endAllocateStreamToPoolE"},
}

// allocatorFunction is one of the allocator's own functions in a library:
// its symbol and the offsets of its return instructions from its start.
// Its results are read there, not by a return probe: a return probe
// replaces the return address, which breaks C++ exception unwinding when
// the function throws (raw_alloc when out of memory): the process would
// abort.
type allocatorFunction struct {
	symbol  string
	returns []uint64
}

// allocatorFunctions finds the functions of functionPrefixes among the
// library's symbols (.symtab: torch's allocator functions are local there,
// not in .dynsym), by name, with their return instructions (none when the
// code cannot be decoded, or ends in a tail call: the caller leaves out a
// function whose results it needs then).
func allocatorFunctions(path string) (map[string]allocatorFunction, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	found := map[string]allocatorFunction{}
	for _, read := range []func() ([]elf.Symbol, error){f.Symbols, f.DynamicSymbols} {
		syms, err := read()
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			return nil, fmt.Errorf("read symbols of %s: %w", path, err)
		}
		for _, s := range syms {
			// A name with a dot is a part or a clone of a function (.cold,
			// .part.0, .isra.0): not its entry.
			if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Value == 0 || strings.Contains(s.Name, ".") {
				continue
			}
			for name, prefixes := range functionPrefixes {
				if _, ok := found[name]; ok || !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(s.Name, p) }) {
					continue
				}
				found[name] = allocatorFunction{symbol: s.Name, returns: returnInstructions(f, s)}
			}
		}
	}
	return found, nil
}

// returnInstructions decodes the function's code (x86-64) and returns the
// offsets of its ret instructions; none when it cannot be read or decoded
// to its end.
func returnInstructions(f *elf.File, sym elf.Symbol) []uint64 {
	var code []byte
	for _, sec := range f.Sections {
		if sec.Type == elf.SHT_PROGBITS && sec.Flags&elf.SHF_EXECINSTR != 0 &&
			sym.Value >= sec.Addr && sym.Value+sym.Size <= sec.Addr+sec.Size {
			code = make([]byte, sym.Size)
			if _, err := sec.ReadAt(code, int64(sym.Value-sec.Addr)); err != nil {
				return nil
			}
		}
	}
	var rets []uint64
	for off := 0; off < len(code); {
		inst, err := x86asm.Decode(code[off:], 64)
		if err != nil {
			return nil
		}
		if inst.Op == x86asm.RET {
			rets = append(rets, uint64(off))
		}
		off += inst.Len
	}
	return rets
}

// allocatorSites reads the library's USDT sites and stores them in
// usdt_sites, the first time; t.mu is held.
func (t *Tracer) allocatorSites(path string) (allocatorSites, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return allocatorSites{}, fmt.Errorf("stat %s: %w", path, err)
	}
	id := fileID{st.Dev, st.Ino}
	if s, ok := t.sites[id]; ok {
		return s, nil
	}
	probes, err := usdt.Read(path)
	if err != nil {
		return allocatorSites{}, err
	}
	var s allocatorSites
	for _, p := range probes {
		site, ok := usdtSite(p)
		if !ok {
			continue
		}
		if max := t.objs.UsdtSites.MaxEntries(); t.usdtSites >= max {
			return allocatorSites{}, fmt.Errorf("%s: more than %d USDT sites in all", path, max)
		}
		if err := t.objs.UsdtSites.Put(t.usdtSites, site); err != nil {
			return allocatorSites{}, fmt.Errorf("store USDT site: %w", err)
		}
		s.addrs, s.refs, s.cookies = append(s.addrs, p.Offset), append(s.refs, p.SemaphoreOffset), append(s.cookies, uint64(t.usdtSites))
		t.usdtSites++
	}
	if len(s.addrs) == 0 {
		return allocatorSites{}, fmt.Errorf("%s: %w", path, ErrNoProbes)
	}
	if s.functions, err = allocatorFunctions(path); err != nil {
		return allocatorSites{}, err
	}
	if t.sites == nil {
		t.sites = map[fileID]allocatorSites{}
	}
	t.sites[id] = s
	return s, nil
}

// usdtSite describes a pytorch:malloc or pytorch:free site for BPF: the
// arguments it reads, pointer first.
func usdtSite(p usdt.Probe) (gpumemGpumemUsdtSite, bool) {
	var site gpumemGpumemUsdtSite
	want := map[string]int{"malloc": 3, "free": 1}[p.Name] // malloc(ptr, device, size, stream)
	if p.Provider != "pytorch" || want == 0 || len(p.Args) < want {
		return site, false
	}
	site.Op = uint16(gpumemGpumemOpGPUMEM_OP_TENSOR_FREE)
	if p.Name == "malloc" {
		site.Op = uint16(gpumemGpumemOpGPUMEM_OP_TENSOR_ALLOC)
	}
	for i, a := range p.Args[:want] {
		// usdt.ArgKind has the values of enum gpumem_usdt_arg_kind.
		site.Args[i].Value, site.Args[i].Reg, site.Args[i].Kind = a.Value, a.Reg, uint8(a.Kind)
		site.Args[i].Size = a.Size
		if a.Signed {
			site.Args[i].IsSigned = 1
		}
	}
	return site, true
}

// DriverFunctions lists the traced functions the library exports, with
// their ops, the attach cookies.
func DriverFunctions(path string) ([]string, []uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	exported := map[string]bool{}
	for _, read := range []func() ([]elf.Symbol, error){f.DynamicSymbols, f.Symbols} {
		syms, _ := read() // stripped files lack .symtab; the driver exports in .dynsym
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 {
				exported[s.Name] = true
			}
		}
	}
	var symbols []string
	var cookies []uint64
	for symbol, op := range memory.Ops() {
		if exported[symbol] {
			symbols = append(symbols, symbol)
			cookies = append(cookies, uint64(op))
		}
	}
	if len(symbols) == 0 {
		return nil, nil, fmt.Errorf("%s exports none of the CUDA memory functions", path)
	}
	return symbols, cookies, nil
}

// pollInterval bounds how long an event waits in the ring buffer: the BPF
// program wakes the reader only once the buffer fills.
const pollInterval = 10 * time.Millisecond

// Read blocks for the next event. It reuses ev's storage, and must not be
// called from two goroutines. After Close it returns an error wrapping
// os.ErrClosed; after Flush, once every event sent before it has been read,
// ringbuf.ErrFlushed.
func (t *Tracer) Read(ev *Event) error {
	for {
		err := t.reader.ReadInto(&t.record)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.reader.SetDeadline(time.Now().Add(pollInterval))
			continue
		}
		if err != nil {
			return err
		}
		if err := decode(t.record.RawSample, ev); err != nil {
			return err
		}
		t.stacks.resolve(ev)
		return nil
	}
}

// NamedPyStacks counts the events Read returned whose Python frames the
// BPF program named by those of an earlier event of the thread instead of
// sending them. Like Read, it must not be called from two goroutines.
func (t *Tracer) NamedPyStacks() uint64 { return t.stacks.named }

// Flush makes Read return the events already sent, then ringbuf.ErrFlushed.
func (t *Tracer) Flush() error { return t.reader.Flush() }

// PythonWalk tells the BPF program how to walk one process's interpreter:
// the address of _PyRuntime and the field offsets (struct gpumem_python).
type PythonWalk = gpumemGpumemPython

// PyNoField marks a field a Python version lacks.
const PyNoField = 0xffff

// AddPython makes the BPF program capture the Python frames of process pid.
func (t *Tracer) AddPython(pid uint32, walk PythonWalk) error {
	t.pythonMu.Lock()
	defer t.pythonMu.Unlock()
	if err := t.objs.PythonProcs.Put(pid, walk); err != nil {
		return fmt.Errorf("register python process %d: %w", pid, err)
	}
	return t.bumpPythonGeneration()
}

// RemovePython forgets an exited Python process.
func (t *Tracer) RemovePython(pid uint32) {
	t.pythonMu.Lock()
	defer t.pythonMu.Unlock()
	if t.objs.PythonProcs.Delete(pid) == nil {
		_ = t.bumpPythonGeneration() // an array's one entry: its update fails only with the map
	}
}

// bumpPythonGeneration has every thread read its process's entry of
// python_procs again: the BPF program keeps a copy per thread. Under
// pythonMu (or in setup, before the tracer is shared), so that the
// generations follow the changes in order.
func (t *Tracer) bumpPythonGeneration() error {
	t.pythonGeneration++
	if err := t.objs.PythonGeneration.Put(uint32(0), t.pythonGeneration); err != nil {
		return fmt.Errorf("announce a change of python processes: %w", err)
	}
	return nil
}

// SwitchDriverOff stops tracing process pid's driver calls: they are
// counted (DriverCallsOff) and not reported, whether entered before or
// after, until the process exits. Events sent before are still to be read.
func (t *Tracer) SwitchDriverOff(pid uint32) error {
	if err := t.objs.DriverOff.Update(pid, uint64(0), ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("switch pid %d's driver view off: %w", pid, err)
	}
	return nil
}

// DriverCallsOff counts process pid's driver calls not traced since its
// driver view was switched off; false when it is not off (or exited).
func (t *Tracer) DriverCallsOff(pid uint32) (uint64, bool) {
	var n uint64
	if err := t.objs.DriverOff.Lookup(pid, &n); err != nil {
		return 0, false
	}
	return n, true
}

// TensorProbeStats are how often the tensor probes' program ran and for how
// long, in every process it is attached for: the run time is counted while
// kernel.bpf_stats_enabled is set (ebpf.EnableStats).
func (t *Tracer) TensorProbeStats() (runs uint64, runtime time.Duration, err error) {
	s, err := t.objs.GpumemTensor.Stats()
	if err != nil {
		return 0, 0, fmt.Errorf("tensor probes' stats: %w", err)
	}
	return s.RunCount, s.Runtime, nil
}

// InFlight counts the driver calls entered and not yet returned.
func (t *Tracer) InFlight() (int, error) {
	var (
		n     int
		key   uint64
		value gpumemGpumemCalls
	)
	it := t.objs.Inflight.Iterate()
	for it.Next(&key, &value) {
		n += int(value.Depth)
	}
	return n, it.Err()
}

// bpfLosses are the BPF loss counters gpumem's programs keep, by the
// reason each counts. The others count for stock IG's programs only.
var bpfLosses = map[gpumemGpumemLoss]schema.Loss{
	gpumemGpumemLossGPUMEM_LOSS_INFLIGHT_FULL:   schema.InflightFull,
	gpumemGpumemLossGPUMEM_LOSS_NESTED_TOO_DEEP: schema.NestedTooDeep,
	gpumemGpumemLossGPUMEM_LOSS_READ_RESULT:     schema.ResultUnreadable,
	gpumemGpumemLossGPUMEM_LOSS_PROCESSES_FULL:  schema.ProcessesFull,
	gpumemGpumemLossGPUMEM_LOSS_SCRATCH_BUSY:    schema.ScratchBusy,
	gpumemGpumemLossGPUMEM_LOSS_CONTEXTS_FULL:   schema.ContextsFull,
	gpumemGpumemLossGPUMEM_LOSS_TENSOR_ARG:      schema.TensorArgUnreadable,
	gpumemGpumemLossGPUMEM_LOSS_ALLOCATOR_CALL:  schema.AllocatorCallIncomplete,
}

// Losses reads the loss counters: everything the BPF side could not
// deliver whole.
func (t *Tracer) Losses() (schema.Losses, error) {
	var l schema.Losses
	var err error
	if l[schema.RingBufferFull], err = sumPerCPU(t.objs.EventsLostSamples, 0); err != nil {
		return l, err
	}
	for key, loss := range bpfLosses {
		if l[loss], err = sumPerCPU(t.objs.Losses, uint32(key)); err != nil {
			return l, err
		}
	}
	return l, nil
}

func sumPerCPU(m *ebpf.Map, key uint32) (uint64, error) {
	var values []uint64
	if err := m.Lookup(key, &values); err != nil {
		return 0, fmt.Errorf("read %s[%d]: %w", m, key, err)
	}
	var sum uint64
	for _, v := range values {
		sum += v
	}
	return sum, nil
}

// Close detaches every probe and frees the BPF objects.
func (t *Tracer) Close() error {
	t.mu.Lock()
	closeAll(t.links)
	t.links = nil
	t.mu.Unlock()
	if t.exit != nil {
		t.exit.Close()
	}
	if t.reader != nil {
		t.reader.Close()
	}
	t.objs.Close()
	return nil
}

func closeAll(links []link.Link) {
	for _, l := range links {
		l.Close()
	}
}
