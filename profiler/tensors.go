package profiler

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpu-mem/gpu-mem/budget"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/discover"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// TensorScope says which processes the tensor view (PyTorch's caching
// allocator, through its USDT probes) covers.
type TensorScope int

const (
	// TensorsAll covers every process that maps PyTorch's allocator, from
	// the moment the profiler attaches (gpumem record's default).
	TensorsAll TensorScope = iota
	// TensorsOnDemand covers the processes switched on (Config.TensorPIDs,
	// SetTensors, a pod's annotation), from then until switched off: the
	// others pay nothing, no trap fires in them (the agent's default).
	TensorsOnDemand
	// TensorsOff leaves the allocator alone: the driver view only.
	TensorsOff
)

// TensorPolicy says whether a container's pod asks for the tensor view,
// until when (zero: until it stops asking) and at what budget; kube.Pods
// reads it from the pod's annotations. An error: the pod asks in words the
// policy cannot read.
type TensorPolicy interface {
	TensorsWanted(container.Identity) (ask snapshot.TensorAsk, ok bool, err error)
}

// tensorSwitch keeps the on-demand tensor views and their probes.
type tensorSwitch struct {
	mu       sync.Mutex
	views    map[uint32]*tensorView // on, waiting for their allocator, or ended (kept for the outputs)
	budget   budget.Budget          // the share of a view asked without one
	rates    budget.Rates           // of the views on
	exceeded uint64                 // views ended by the budget
	unread   map[uint32]string      // processes whose pods ask in words that cannot be read, and why
}

type tensorView struct {
	snapshot.TensorView
	links    []io.Closer     // the allocators' probes
	attached map[string]bool // library IDs
}

// maxEndedViews bounds the ended views kept for the outputs.
const maxEndedViews = 256

func newTensorSwitch(b budget.Budget) *tensorSwitch {
	return &tensorSwitch{views: map[uint32]*tensorView{}, budget: b, rates: budget.Rates{}}
}

// ErrTensorsOff is returned by SetTensors when the profiler was configured
// without tensor views, and ErrTensorsAll when every process has one.
var (
	ErrTensorsOff = errors.New("the tensor view is off (--tensors=off)")
	ErrTensorsAll = errors.New("the tensor view is on for every process (--tensors=all)")
)

// SetTensors switches process pid's tensor view on as ask says, or changes
// the end and budget of one on. Its probes are attached at the next scan,
// or once the process loads PyTorch's allocator.
func (p *Profiler) SetTensors(pid int, ask snapshot.TensorAsk) error {
	switch p.cfg.Tensors {
	case TensorsOff:
		return ErrTensorsOff
	case TensorsAll:
		return ErrTensorsAll
	}
	if pid <= 0 || gone(p.cfg.ProcRoot, pid) {
		return fmt.Errorf("%w %d", ErrNoProcess, pid)
	}
	p.tensors.set(uint32(pid), ask, time.Now())
	return nil
}

// set switches process pid's view on as ask says, asked at now, or
// changes the end and budget of one on.
func (s *tensorSwitch) set(pid uint32, ask snapshot.TensorAsk, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.views[pid]; v != nil && v.Ended.IsZero() {
		v.Until, v.Budget = ask.Until, s.share(ask)
		return
	}
	s.views[pid] = &tensorView{
		TensorView: snapshot.TensorView{PID: pid, By: ask.By, Asked: now, Until: ask.Until, Budget: s.share(ask)},
		attached:   map[string]bool{},
	}
	delete(s.rates, pid) // an ended view's window: the new one's begins
	s.trimEnded()
}

// StopTensors switches process pid's tensor view off: its probes are
// detached, and what it held is released implicitly.
func (p *Profiler) StopTensors(pid int) error {
	if !p.endTensors(uint32(pid), "switched off", false) {
		return fmt.Errorf("no tensor view on for pid %d", pid)
	}
	return nil
}

// TensorViews returns the on-demand tensor views, on, waiting or ended, by
// PID.
func (p *Profiler) TensorViews() []snapshot.TensorView { return p.tensors.list() }

func (s *tensorSwitch) list() []snapshot.TensorView {
	s.mu.Lock()
	defer s.mu.Unlock()
	views := make([]snapshot.TensorView, 0, len(s.views))
	for _, v := range s.views {
		views = append(views, v.TensorView)
	}
	slices.SortFunc(views, func(a, b snapshot.TensorView) int { return int(a.PID) - int(b.PID) })
	return views
}

// TensorProbeStats are how often the tensor probes ran, in every process,
// and for how long (counted while kernel.bpf_stats_enabled is set).
func (p *Profiler) TensorProbeStats() (runs uint64, runtime time.Duration, err error) {
	return p.tr.TensorProbeStats()
}

// BudgetExceeded counts the tensor views the budget switched off.
func (p *Profiler) BudgetExceeded() uint64 {
	p.tensors.mu.Lock()
	defer p.tensors.mu.Unlock()
	return p.tensors.exceeded
}

// trimEnded drops the oldest ended views past maxEndedViews; s.mu held.
func (s *tensorSwitch) trimEnded() {
	var ended []*tensorView
	for _, v := range s.views {
		if !v.Ended.IsZero() {
			ended = append(ended, v)
		}
	}
	if len(ended) <= maxEndedViews {
		return
	}
	slices.SortFunc(ended, func(a, b *tensorView) int { return a.Ended.Compare(b.Ended) })
	for _, v := range ended[:len(ended)-maxEndedViews] {
		delete(s.views, v.PID)
	}
}

// updateTensors is the scan's part for the on-demand views: pods' asks,
// views due to end, probes for views waiting for their allocator, and the
// budget.
func (p *Profiler) updateTensors(now time.Time) {
	if p.cfg.Tensors != TensorsOnDemand {
		return
	}
	p.askByPods(now)
	for _, pid := range p.tensors.due(p.cfg.ProcRoot, now) {
		p.endTensors(pid.pid, pid.why, false)
	}
	for _, pid := range p.tensors.waiting() {
		p.attachTensors(pid)
	}
	for _, over := range p.tensors.overBudget(now, p.books.tensorAllocs()) {
		p.endTensors(over.PID, over.Why, true)
	}
}

// askByPods switches on the views of processes whose pods ask for one,
// changes their end and budget as the pods do, and switches off those of
// pods that stopped asking. A view its budget switched off stays off until
// its pod asks again otherwise (another budget, another end).
func (p *Profiler) askByPods(now time.Time) {
	policy := p.cfg.TensorAsks
	if policy == nil {
		return
	}
	asked := map[uint32]snapshot.TensorAsk{}
	unread := map[uint32]string{}
	for pid, c := range p.procs.containers() {
		ask, ok, err := policy.TensorsWanted(c)
		switch {
		case err != nil:
			unread[pid] = err.Error()
		case ok && (ask.Until.IsZero() || ask.Until.After(now)):
			ask.By = snapshot.ByAnnotation
			asked[pid] = ask
		}
	}
	for pid, why := range p.tensors.unreadAsks(unread) {
		logs.Printf(p.cfg.Log, "pid %d: tensor view not switched on: its pod's annotations: %s", pid, why)
	}
	for _, v := range p.tensors.list() {
		if _, still := asked[v.PID]; v.By == snapshot.ByAnnotation && v.Ended.IsZero() && !still {
			p.endTensors(v.PID, "the pod's annotation is gone", false)
		}
	}
	for pid, ask := range asked {
		switch p.tensors.answer(pid, ask) {
		case askNew:
			if err := p.SetTensors(int(pid), ask); err == nil {
				logs.Printf(p.cfg.Log, "pid %d: tensor view asked by its pod", pid)
			}
		case askChanged:
			if err := p.SetTensors(int(pid), ask); err == nil {
				logs.Printf(p.cfg.Log, "pid %d: tensor view's end or budget changed by its pod", pid)
			}
		}
	}
}

// What a pod's ask is to a process's view.
type askAnswer int

const (
	askHeld    askAnswer = iota // the view is on as asked, or the budget ended it and the ask is the same
	askNew                      // no view on: switch one on
	askChanged                  // the pod's view is on, with another end or budget
)

func (s *tensorSwitch) answer(pid uint32, ask snapshot.TensorAsk) askAnswer {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.views[pid]
	if v == nil || v.By != snapshot.ByAnnotation {
		if v != nil && v.Ended.IsZero() {
			return askHeld // on by a flag or the control socket
		}
		return askNew
	}
	same := v.Until.Equal(ask.Until) && v.Budget == s.share(ask)
	switch {
	case v.Ended.IsZero() && same, v.OverBudget && same:
		return askHeld
	case v.Ended.IsZero():
		return askChanged
	}
	return askNew
}

// share is the budget's share a view asked so gets.
func (s *tensorSwitch) share(ask snapshot.TensorAsk) float64 {
	if ask.Budget != nil {
		return *ask.Budget
	}
	return s.budget.Share
}

// unreadAsks keeps the processes whose pods' asks could not be read, and
// returns those whose reason is new: each is said once.
func (s *tensorSwitch) unreadAsks(unread map[uint32]string) map[uint32]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	news := map[uint32]string{}
	for pid, why := range unread {
		if s.unread[pid] != why {
			news[pid] = why
		}
	}
	s.unread = unread
	return news
}

type endingView struct {
	pid uint32
	why string
}

// due returns the views to end now: past their end, or their process gone.
func (s *tensorSwitch) due(procRoot string, now time.Time) []endingView {
	s.mu.Lock()
	defer s.mu.Unlock()
	var due []endingView
	for pid, v := range s.views {
		switch {
		case !v.Ended.IsZero():
		case gone(procRoot, int(pid)):
			due = append(due, endingView{pid, "the process exited"})
		case !v.Until.IsZero() && !now.Before(v.Until):
			due = append(due, endingView{pid, "its time was up"})
		}
	}
	return due
}

// waiting returns the views whose allocator is not attached yet.
func (s *tensorSwitch) waiting() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pids []uint32
	for pid, v := range s.views {
		if v.Ended.IsZero() && len(v.links) == 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// attachTensors attaches the tensor probes to the allocators process pid
// maps, for it alone, and starts its tensor books.
func (p *Profiler) attachTensors(pid uint32) {
	found, err := discover.Scan(p.cfg.ProcRoot, []int{int(pid)})
	if err != nil {
		return
	}
	for _, lib := range found.Libraries {
		if !lib.Allocator || !p.tensors.wants(pid, lib.ID()) {
			continue
		}
		p.books.startTensorView(pid)
		probes, err := p.tr.AttachAllocator(lib.Path, pid)
		if err != nil {
			logs.Printf(p.cfg.Log, "pid %d: tensor view: %v", pid, err)
			continue
		}
		since := p.tensors.attached(pid, lib.ID(), probes)
		logs.Event(p.cfg.Log, logs.TensorView, fmt.Sprintf("pid %d: tensor view on since %s: %d PyTorch allocator probes%s on %s",
			pid, since.Format(time.RFC3339Nano), probes.Sites, functionsFollowed(probes), lib.Path),
			"pid", pid, "library", lib.Path, "probes", probes.Sites, "since", since)
	}
}

// wants says whether process pid's view is on and lacks library id.
func (s *tensorSwitch) wants(pid uint32, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.views[pid]
	return v != nil && v.Ended.IsZero() && !v.attached[id]
}

// attached records a link of process pid's view and returns since when the
// view holds. A view ended meanwhile has the link closed.
func (s *tensorSwitch) attached(pid uint32, id string, l io.Closer) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.views[pid]
	if v == nil || !v.Ended.IsZero() {
		l.Close()
		return time.Time{}
	}
	v.links = append(v.links, l)
	v.attached[id] = true
	if v.Since.IsZero() {
		v.Since = time.Now()
	}
	return v.Since
}

// endTensors ends process pid's view: its probes detached, the events they
// sent read, then its tensor books closed. False when it had none on.
func (p *Profiler) endTensors(pid uint32, why string, overBudget bool) bool {
	links, ok := p.tensors.end(pid, why, overBudget)
	if !ok {
		return false
	}
	for _, l := range links {
		l.Close()
	}
	if len(links) > 0 {
		if err := p.flush(); err == nil {
			p.books.endTensorView(pid, bpfNow())
		}
	}
	if overBudget {
		why += fmt.Sprintf("; a budget of its own keeps it on: gpumem tensors on %d --budget SHARE, "+
			"or the pod's gpu-mem.io/tensors-budget annotation", pid)
	}
	logs.Printf(p.cfg.Log, "pid %d: tensor view off: %s", pid, why)
	return true
}

func (s *tensorSwitch) end(pid uint32, why string, overBudget bool) ([]io.Closer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.views[pid]
	if v == nil || !v.Ended.IsZero() {
		return nil, false
	}
	v.Ended, v.Why, v.OverBudget = time.Now(), why, overBudget
	if overBudget {
		s.exceeded++
	}
	links := v.links
	v.links = nil
	return links, true
}

// overBudget returns the views whose allocations over the last window cost
// more than their budget (the switch's, with the view's share); allocs are
// each process's tensor allocations so far. A view is measured from its
// probes' attach until it ends.
func (s *tensorSwitch) overBudget(now time.Time, allocs map[uint32]uint64) []budget.Over {
	s.mu.Lock()
	defer s.mu.Unlock()
	on := map[uint32]uint64{}
	for pid, v := range s.views {
		if v.Ended.IsZero() && !v.Since.IsZero() {
			on[pid] = allocs[pid]
		}
	}
	return s.rates.Over(now, on, func(pid uint32) budget.Budget {
		b := s.budget
		b.Share = s.views[pid].Budget
		return b
	}, "tensor")
}

// closeTensors detaches every on-demand view's probes (Run's end).
func (p *Profiler) closeTensors() {
	p.tensors.mu.Lock()
	defer p.tensors.mu.Unlock()
	for _, v := range p.tensors.views {
		for _, l := range v.links {
			l.Close()
		}
		v.links = nil
	}
}

// functionsFollowed says, in the line that reports an allocator attached,
// which of the allocator's own functions the library lacks: their changes
// to the books (a CUDA graph pool's checkpoint restore, raw frees) pass no
// USDT site and are not followed, and without the pool's begin and end a
// graph's pool is counted as allocator cache
// (docs/pytorch-allocator-books.md).
func functionsFollowed(p *tracer.AllocatorProbes) string {
	if len(p.Missing) == 0 {
		return ", setCheckpointPoolState, raw_alloc, raw_delete, beginAllocateToPool and endAllocateToPool"
	}
	what := "what it changes is not followed"
	if slices.ContainsFunc(p.Missing, func(f string) bool { return strings.HasSuffix(f, "AllocateToPool") }) {
		what += "; CUDA graphs' pools are counted as allocator cache"
	}
	return fmt.Sprintf(" (no %s: %s)", strings.Join(p.Missing, ", "), what)
}
