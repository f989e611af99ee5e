package breakdown

import (
	"cmp"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// Of is where each traced process's memory went on each GPU, by the
// snapshot's rows, sorted by the rules (Default when nil): by PID, then
// GPU. Memory in the host's RAM and processes gpu-mem does not trace are
// left out.
func Of(s *snapshot.Snapshot, rules *Rules) []snapshot.Breakdown {
	if rules == nil {
		rules = Default()
	}
	sorter := newSorter(rules, s)
	s.EachRow(sorter.add)
	frag := fragmentation(s.Layout, func(k accounting.Key) []*symbolize.Frame { return sorter.frames[k] }, false)
	return sorter.breakdowns(s.GPUMemory, frag)
}

// where is one process on one GPU.
type where struct {
	pid uint32
	gpu string
}

// Categorizer names the category of rows one at a time, each frame's rule
// kept: for a reader of many rows at once (an interval's), made anew for
// each, as frames are kept only while their processes are.
type Categorizer struct {
	rules *Rules
	// claimed caches each frame's rule, for tensors and for driver memory:
	// frames are shared by every row through them.
	claimed [2]map[*symbolize.Frame]*rule
}

// Categorizer is a Categorizer by rs (Default when nil).
func (rs *Rules) Categorizer() *Categorizer {
	if rs == nil {
		rs = Default()
	}
	return &Categorizer{rules: rs, claimed: [2]map[*symbolize.Frame]*rule{{}, {}}}
}

// Category is the category of one row's memory, as a flame graph's
// series is labelled; library is library_workspaces' library. A driver
// row of PyTorch's allocator is AllocatorSegments whole: how much of a
// segment is cache, only the breakdown says. Empty for memory of no
// category (the host's, an untraced process's).
func (c *Categorizer) Category(r *snapshot.Row) (category, library string) {
	gpu := r.Key.GPU()
	if gpu == memory.GPUHost || gpu == "managed" || r.Kind == memory.KindUntraced || r.Kind == memory.KindHost {
		return "", ""
	}
	switch {
	case r.Kind == memory.KindContext:
		return snapshot.Context, ""
	case r.Kind == memory.KindModule:
		return snapshot.Modules, ""
	case r.Kind == memory.KindDriverInternal:
		return snapshot.DriverInternal, ""
	case slices.ContainsFunc(r.Frames, func(f *symbolize.Frame) bool { return f.Function == memory.GraphPool }):
		return snapshot.CUDAGraphPools, ""
	case r.Kind == memory.KindTensor:
		return c.tensorCategory(r.Frames), ""
	case isSegment(r.Frames):
		return snapshot.AllocatorSegments, ""
	}
	return c.driverCategory(r.Frames)
}

// sorter adds up rows into parts.
type sorter struct {
	*Categorizer
	tensors map[uint32]bool // the processes whose tensor view is on
	procs   map[where]*process
	// frames are the stacks of the driver rows the layout has
	// allocations of, to tell segments by.
	frames map[accounting.Key][]*symbolize.Frame
}

// process is one process's parts on one GPU as they add up.
type process struct {
	snapshot.Breakdown
	parts    map[string]*snapshot.Part // by Part.Name
	segments uint64                    // outside graph pools
	tensors  uint64                    // outside graph pools
}

func newSorter(rules *Rules, s *snapshot.Snapshot) *sorter {
	st := &sorter{Categorizer: rules.Categorizer(), procs: map[where]*process{}, tensors: map[uint32]bool{},
		frames: map[accounting.Key][]*symbolize.Frame{}}
	for _, a := range s.Layout {
		if a.Kind == memory.KindDevice {
			st.frames[a.Key] = nil
		}
	}
	// A process has its tensors known when it has tensor rows, unless an
	// on-demand view of it is not on (ended, or not yet attached).
	for i := range s.Entries {
		if s.Entries[i].Kind == memory.KindTensor {
			st.tensors[s.Entries[i].PID] = true
		}
	}
	for _, v := range s.TensorViews {
		st.tensors[v.PID] = !v.Since.IsZero() && v.Ended.IsZero()
	}
	return st
}

func (st *sorter) add(r *snapshot.Row) {
	if _, ok := st.frames[r.Key]; ok {
		st.frames[r.Key] = slices.Clone(r.Frames)
	}
	live := r.LiveBytes()
	category, library := st.Category(r)
	if live == 0 || category == "" || r.Kind == memory.KindTensor && category == snapshot.CUDAGraphPools {
		return // a graph pool's tensors are inside its segments, counted with them
	}
	p := st.process(r, r.Key.GPU())
	switch {
	case r.Kind == memory.KindTensor:
		p.tensors += live
	case category == snapshot.AllocatorSegments:
		p.segments += live
	}
	p.charge(category, library, r, live)
}

func (st *sorter) process(r *snapshot.Row, gpu string) *process {
	w := where{r.PID, gpu}
	p := st.procs[w]
	if p == nil {
		p = &process{Breakdown: snapshot.Breakdown{PID: r.PID, GPU: gpu, Comm: r.Comm, Device: r.Device, Container: r.Container,
			TensorView: st.tensors[r.PID]}, parts: map[string]*snapshot.Part{}}
		st.procs[w] = p
	}
	return p
}

// charge adds a row's live bytes to a part, and its stack to the part's
// holders if it holds among the most.
func (p *process) charge(category, library string, r *snapshot.Row, live uint64) {
	part := snapshot.Part{Category: category, Library: library}
	name := part.Name()
	if p.parts[name] == nil {
		p.parts[name] = &part
	}
	pt := p.parts[name]
	pt.Bytes += live
	pt.Keys = append(pt.Keys, r.Key)
	if len(pt.Top) == snapshot.MaxHolders && pt.Top[len(pt.Top)-1].Bytes >= live {
		return
	}
	pt.Top = append(pt.Top, snapshot.Holding{Stack: r.Stack, Kind: r.Kind, Frames: slices.Clone(r.Frames), Bytes: live})
	slices.SortStableFunc(pt.Top, func(a, b snapshot.Holding) int { return cmp.Compare(b.Bytes, a.Bytes) })
	pt.Top = pt.Top[:min(len(pt.Top), snapshot.MaxHolders)]
}

func (c *Categorizer) tensorCategory(frames []*symbolize.Frame) string {
	if r := c.claim(frames, true); r != nil {
		return r.category
	}
	return snapshot.Activations
}

// driverCategory sorts driver memory outside PyTorch's allocator: by the
// rules, else by the library that called the CUDA driver or runtime, when
// it is a library of its own (libfoo.so) and not the interpreter's or the
// system's.
func (c *Categorizer) driverCategory(frames []*symbolize.Frame) (category, library string) {
	if r := c.claim(frames, false); r != nil {
		return r.category, r.library
	}
	for _, f := range frames {
		name := libraryName(f.Module)
		if name == "libcuda" || name == "libcudart" {
			continue
		}
		if name != "" && !notWorkspaces[name] && !strings.HasPrefix(name, "libpython") {
			return snapshot.LibraryWorkspaces, name
		}
		break
	}
	return snapshot.OtherDriver, ""
}

// notWorkspaces are the libraries that call the driver for a caller above
// them: ctypes' libffi, the C and C++ runtimes (and libpython*, the
// interpreter).
var notWorkspaces = map[string]bool{"libffi": true, "libc": true, "libstdc++": true, "libgcc_s": true, "libpthread": true}

// libraryName is a shared object's name without its directory and
// version ("libfoo" for /usr/lib/libfoo.so.12); empty for what is not a
// shared library.
func libraryName(module string) string {
	name, _, ok := strings.Cut(filepath.Base(module), ".so")
	if module == "" || !ok || !strings.HasPrefix(name, "lib") {
		return ""
	}
	return name
}

// claim is the rule claiming the innermost frame it can, each frame's
// answer kept.
func (c *Categorizer) claim(frames []*symbolize.Frame, tensors bool) *rule {
	i := 0
	if tensors {
		i = 1
	}
	for _, f := range frames {
		r, seen := c.claimed[i][f]
		if !seen {
			r = c.rules.claimOf(f, tensors)
			c.claimed[i][f] = r
		}
		if r != nil {
			return r
		}
	}
	return nil
}

// breakdowns finishes the parts: with the tensor view, the segments' part
// becomes the cache, the segments less their tensors.
func (st *sorter) breakdowns(nvml *snapshot.GPUMemory, frag map[where]*snapshot.Fragmentation) []snapshot.Breakdown {
	out := make([]snapshot.Breakdown, 0, len(st.procs))
	for w, p := range st.procs {
		pm, _ := nvml.Of(p.PID, p.GPU)
		p.NVML = pm != nil
		if p.TensorView {
			p.Fragmentation = frag[w]
		}
		if seg := p.parts[snapshot.AllocatorSegments]; seg != nil && p.TensorView {
			seg.Category = snapshot.AllocatorCache
			seg.Bytes = p.segments - min(p.tensors, p.segments)
		}
		for _, part := range p.parts {
			if part.Bytes > 0 {
				p.Parts = append(p.Parts, *part)
			}
		}
		sortParts(p.Parts)
		out = append(out, p.Breakdown)
	}
	slices.SortFunc(out, func(a, b snapshot.Breakdown) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), strings.Compare(a.GPU, b.GPU))
	})
	return out
}

// sortParts sorts parts by bytes, descending, then by name.
func sortParts(parts []snapshot.Part) {
	slices.SortFunc(parts, func(a, b snapshot.Part) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), strings.Compare(a.Name(), b.Name()))
	})
}
