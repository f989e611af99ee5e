package report

import (
	"sort"
	"strings"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// Growth follows each stack's live bytes over a sliding window, for top: a
// leak is a stack whose live bytes grow window after window.
type Growth struct {
	Window  time.Duration
	samples []growthSample // oldest first
}

type growthSample struct {
	at   time.Time
	live map[accounting.Key]uint64
}

// Observe records the live bytes of r's rows at r.Time and returns how
// much each grew since the window began: since the last sample at least
// Window old, or the first sample while the history is shorter. A row not
// seen then grew from zero.
func (g *Growth) Observe(r *snapshot.Snapshot) map[accounting.Key]int64 {
	now := growthSample{at: r.Time, live: make(map[accounting.Key]uint64, r.Len())}
	for _, row := range r.Rows() {
		now.live[row.Key] = row.LiveBytes()
	}
	// Keep one sample at or before the window's start, as the baseline.
	start := r.Time.Add(-g.Window)
	for len(g.samples) > 1 && !g.samples[1].at.After(start) {
		g.samples = g.samples[1:]
	}
	g.samples = append(g.samples, now)
	base := g.samples[0]
	grew := make(map[accounting.Key]int64, len(now.live))
	for k, live := range now.live {
		grew[k] = int64(live) - int64(base.live[k])
	}
	return grew
}

// Grower is a stack whose live bytes grew over the window.
type Grower struct {
	snapshot.Row
	Growth int64
}

// Growers are the n rows of r that grew most, largest first; rows that did
// not grow are left out.
func Growers(r *snapshot.Snapshot, grew map[accounting.Key]int64, n int) []Grower {
	var out []Grower
	for _, row := range r.Rows() {
		if g := grew[row.Key]; g > 0 {
			out = append(out, Grower{row, g})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Growth > out[j].Growth })
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// SignedBytes formats a change of bytes: +1.5 MiB, -512 B, 0.
func SignedBytes(n int64) string {
	switch {
	case n > 0:
		return "+" + HumanBytes(uint64(n))
	case n < 0:
		return "-" + HumanBytes(uint64(-n))
	}
	return "0"
}

// windowName is how top labels a window: 1m, 30s, 1m30s.
func windowName(d time.Duration) string {
	s := d.Round(time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	return s
}
