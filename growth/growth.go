// Package growth finds the memory that grows: per process, stack, kind and
// GPU (a row of the books), the least it held each interval (its
// low-water mark, snapshot.Entry.Low) rising interval after interval. A
// training step's tensors rise and fall within the step, so their low
// stays; a KV cache or a workspace built lazily rises, then stays, so its
// low stops rising; memory kept, more of it each interval (a loss summed
// with its graph, outputs appended to a list) raises the low every
// interval. A row is growing when its low rose in each of the last
// Intervals intervals; its rate is the rise over those intervals' span.
// From the rates and NVML's free memory, each GPU's time to exhaustion.
package growth

import (
	"cmp"
	"slices"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// DefaultIntervals is how many intervals in a row a low must rise: at the
// agent's 15 s interval, a minute, found at the end of the fifth interval
// a leak began in, longer than a KV cache or a workspace takes to fill
// within one request or warm-up.
const DefaultIntervals = 4

// Detector follows the rows' low-water marks from interval to interval.
// Not safe for concurrent use.
type Detector struct {
	// Intervals is how many intervals in a row a row's low must rise for
	// it to be growing; DefaultIntervals if 0.
	Intervals int
	rows      map[accounting.Key]*history
	last      time.Time // the previous interval's end
}

// history is a row's rising low-water marks: the last Intervals+1 at most,
// oldest first, each higher than the one before. Rows whose low is 0 and
// did not rise have none.
type history struct {
	marks []mark
	since time.Time // the end of the last interval whose low did not rise
	seen  time.Time // the last interval it was in
}

type mark struct {
	low uint64
	at  time.Time
}

// Observe takes an interval's snapshot (Profiler.EndInterval's, its rows'
// lows the interval's) and sets its Growing and Exhaustion: the rows whose
// low rose in each of the last Intervals intervals, and when each GPU
// they are on runs out at their rates. It reads s.Breakdown, if set, for
// the slack inside the allocators' segments. The intervals must come in
// order; it advances the detector by one.
func (d *Detector) Observe(s *snapshot.Snapshot) {
	n := cmp.Or(d.Intervals, DefaultIntervals)
	if d.rows == nil {
		d.rows = map[accounting.Key]*history{}
	}
	s.Growing = s.Growing[:0]
	for i := range s.Entries {
		e := &s.Entries[i]
		if e.Kind.FromNVML() {
			continue
		}
		h := d.rows[e.Key]
		if h == nil {
			if e.Low == 0 || d.last.IsZero() {
				continue
			}
			// It held nothing all the interval before (a row not in the
			// books then held nothing either).
			h = &history{marks: []mark{{0, d.last}}, since: d.last}
			d.rows[e.Key] = h
		}
		h.seen = s.Time
		if h.observe(mark{e.Low, s.Time}, n) {
			s.Growing = append(s.Growing, h.growing(s.RowOf(e)))
		}
	}
	d.forget(s)
	d.last = s.Time
	slices.SortFunc(s.Growing, func(a, b snapshot.Growing) int {
		return cmp.Or(cmp.Compare(b.BytesPerSecond, a.BytesPerSecond), cmp.Compare(a.PID, b.PID), cmp.Compare(a.Stack, b.Stack))
	})
	s.Exhaustion = exhaustion(s)
}

// observe adds the interval's mark and says whether the row is growing:
// its low rose in each of the last n intervals. A mark that did not rise
// starts the history again from it.
func (h *history) observe(m mark, n int) bool {
	if last := h.marks[len(h.marks)-1]; m.low <= last.low {
		h.marks, h.since = h.marks[:0], last.at
	}
	if len(h.marks) == n+1 {
		h.marks = append(h.marks[:0], h.marks[1:]...)
	}
	h.marks = append(h.marks, m)
	return len(h.marks) == n+1
}

// growing is what a growing row's history says of it.
func (h *history) growing(r snapshot.Row) snapshot.Growing {
	first, last := h.marks[0], h.marks[len(h.marks)-1]
	window := last.at.Sub(first.at)
	g := snapshot.Growing{Key: r.Key, Comm: r.Comm, Device: r.Device, Container: r.Container, Frames: r.Frames,
		Low: last.low, Grew: last.low - first.low, Window: window, Since: h.since, At: last.at}
	if window > 0 {
		g.BytesPerSecond = float64(g.Grew) / window.Seconds()
	}
	return g
}

// forget lets go of the rows not in s, or whose low fell to 0: a process
// dropped, or nothing kept. Those of processes waiting for their stacks'
// names (left out of s, in a later interval) are kept.
func (d *Detector) forget(s *snapshot.Snapshot) {
	for k, h := range d.rows {
		last := h.marks[len(h.marks)-1]
		if h.seen.Equal(s.Time) && last.low > 0 {
			continue
		}
		if !h.seen.Equal(s.Time) && slices.Contains(s.Waiting, k.PID) {
			continue
		}
		delete(d.rows, k)
	}
}

// exhaustion is, per GPU NVML shows that a growing row is on, its free
// memory over the rate of its processes' growth: each process's faster
// view's. Its tensors' growth, where the tensor view is on, is the
// demand: the allocator's segments follow it, a segment at a time, from
// whichever stack asks when the cache is full, so that the driver view's
// growing stacks may hold part of it only. Tensors growing while the
// segments do not fill the free space inside them first.
func exhaustion(s *snapshot.Snapshot) []snapshot.Exhaustion {
	if s.GPUMemory == nil || len(s.Growing) == 0 {
		return nil
	}
	type onGPU struct {
		pid uint32
		gpu int // NVML's index
	}
	type viewRates struct{ driver, tensor float64 }
	rates := map[onGPU]*viewRates{}
	var order []onGPU
	fastest := map[onGPU]snapshot.Growing{} // s.Growing is by rate
	for _, g := range s.Growing {
		index, ok := nvmlIndex(g, s.GPUMemory.GPUs)
		if !ok {
			continue // not on a GPU NVML shows
		}
		k := onGPU{g.PID, index}
		if rates[k] == nil {
			rates[k] = &viewRates{}
			order = append(order, k)
			fastest[k] = g
		}
		if g.Kind.View() == memory.ViewDriver {
			rates[k].driver += g.BytesPerSecond
		} else {
			rates[k].tensor += g.BytesPerSecond
		}
	}
	var out []snapshot.Exhaustion
	for _, gpu := range s.GPUMemory.GPUs {
		e := snapshot.Exhaustion{GPU: gpu.Index, UUID: gpu.UUID, Free: free(gpu)}
		for _, k := range order {
			if k.gpu != gpu.Index {
				continue
			}
			rate := max(rates[k].driver, rates[k].tensor)
			if rates[k].driver == 0 {
				e.Slack += allocatorSlack(s.Breakdown, k.pid, fastest[k].Key.GPU())
			}
			g := fastest[k]
			e.Processes = append(e.Processes, snapshot.ExhaustionShare{PID: k.pid, Comm: g.Comm, Container: g.Container,
				BytesPerSecond: rate, Frames: g.Frames})
			e.BytesPerSecond += rate
		}
		if e.BytesPerSecond == 0 {
			continue
		}
		e.Seconds = float64(e.Free+e.Slack) / e.BytesPerSecond
		for i := range e.Processes {
			e.Processes[i].Share = e.Processes[i].BytesPerSecond / e.BytesPerSecond
		}
		slices.SortFunc(e.Processes, func(a, b snapshot.ExhaustionShare) int {
			return cmp.Or(cmp.Compare(b.BytesPerSecond, a.BytesPerSecond), cmp.Compare(a.PID, b.PID))
		})
		out = append(out, e)
	}
	return out
}

// nvmlIndex is NVML's index of the GPU a growing row is on: found by its
// UUID, or where gpu-mem cannot tell which GPUs the process sees (no
// NVIDIA driver's description in /proc, as on the simulated driver), the
// index its CUDA ordinal is (package nvmlparts does the same).
func nvmlIndex(g snapshot.Growing, gpus []snapshot.GPU) (int, bool) {
	if !g.Kind.OnDevice() || g.Key.Device < 0 {
		return 0, false
	}
	for _, gpu := range gpus {
		if g.Device.UUID == gpu.UUID || (g.Device.UUID == "" && int32(gpu.Index) == g.Key.Device) {
			return gpu.Index, true
		}
	}
	return 0, false
}

// free is the GPU's memory no process uses, as nvidia-smi's memory.free
// says: its total less what the driver reserves and what is used.
func free(g snapshot.GPU) uint64 {
	if taken := g.Reserved + g.Used; taken < g.Total {
		return g.Total - taken
	}
	return 0
}

// allocatorSlack is the free space inside the process's allocator's
// segments on the GPU (its breakdown's allocator cache), 0 if unknown.
func allocatorSlack(bs []snapshot.Breakdown, pid uint32, gpu string) uint64 {
	for _, b := range bs {
		if b.PID != pid || b.GPU != gpu {
			continue
		}
		for _, p := range b.Parts {
			if p.Category == snapshot.AllocatorCache {
				return p.Bytes
			}
		}
	}
	return 0
}
