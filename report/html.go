package report

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

//go:embed flamegraph.html
var flameGraphPage string

// flameNode is one frame of the flame graph: bytes live (i) and allocated
// (a) under it, its source location (w) for Python frames.
type flameNode struct {
	Name     string       `json:"n"`
	Where    string       `json:"w,omitempty"`
	Inuse    uint64       `json:"i"`
	Alloc    uint64       `json:"a"`
	Children []*flameNode `json:"c,omitempty"`
	index    map[string]*flameNode
}

func (n *flameNode) child(name, where string) *flameNode {
	key := name + "\x00" + where
	if c, ok := n.index[key]; ok {
		return c
	}
	if n.index == nil {
		n.index = map[string]*flameNode{}
	}
	c := &flameNode{Name: name, Where: where}
	n.index[key] = c
	n.Children = append(n.Children, c)
	return c
}

func (n *flameNode) sort() {
	sort.Slice(n.Children, func(i, j int) bool { return n.Children[i].Name < n.Children[j].Name })
	for _, c := range n.Children {
		c.sort()
	}
}

func where(f symbolize.Frame) string {
	if f.File == "" {
		return ""
	}
	return fmt.Sprintf("%s:%d", f.File, f.Line)
}

// flamePage is what the page draws: a tree per view, by view name, and
// the views side by side per process and GPU.
type flamePage struct {
	Views    map[string]*flameNode `json:"views"`
	Summary  []summaryRow          `json:"summary"`
	Timeline *timelinePage         `json:"timeline"` // null without one
	// Breakdown is each process's breakdown on each GPU, and Parts the
	// flame graph of each of its parts, by "PID/GPU/part".
	Breakdown []htmlBreakdown       `json:"breakdown"`
	Parts     map[string]*flameNode `json:"parts"`
	// Growing says what grew interval after interval, and when each GPU
	// runs out at that rate, a line each (GrowingLine, ExhaustionLine).
	Growing []string `json:"growing"`
}

// htmlBreakdown is one process's breakdown on one GPU, as the page's
// stacked bar draws it.
type htmlBreakdown struct {
	Process string     `json:"process"`
	PID     uint32     `json:"pid"`
	GPU     string     `json:"gpu"`
	Bytes   uint64     `json:"bytes"`
	Of      string     `json:"of"` // what the parts sum to: nvidia-smi, or the driver view
	Parts   []htmlPart `json:"parts"`
}

type htmlPart struct {
	Name  string `json:"name"` // Part.Name
	Bytes uint64 `json:"bytes"`
}

// summaryRow is a ProcessGPU for the page; Cache is null where it means
// nothing (see ProcessGPU.Cache).
type summaryRow struct {
	Process   string  `json:"process"`
	PID       uint32  `json:"pid"`
	GPU       string  `json:"gpu"`
	Held      uint64  `json:"held"`
	Tensors   uint64  `json:"tensors"`
	Segments  uint64  `json:"segments"`
	GraphPool uint64  `json:"graph_pool"`
	Cache     *uint64 `json:"cache"`
	// TensorsSince says from when the process's on-demand tensor view
	// holds; empty for one on from the start.
	TensorsSince string `json:"tensors_since,omitempty"`
	// DriverOff says since when and why the process's driver view is off
	// (its budget): its held bytes are partial.
	DriverOff string `json:"driver_off,omitempty"`
}

// WriteHTML writes a self-contained flame graph page (no network access
// when opened) with a switch between the views, the driver view ("GPU
// memory") first: a tree per view, never one of both, whose root is every
// process, then one bar per process, one per device, then the frames from
// the outermost; live and allocated bytes can be switched. Above it, each
// process's memory per GPU in both views and the allocator's cache, and,
// with r.Timeline, each process's live bytes per GPU over time in the view
// shown, a click on a moment showing its flame graph.
func WriteHTML(w io.Writer, r *snapshot.Snapshot) error {
	page := flamePage{Views: map[string]*flameNode{}, Summary: []summaryRow{}, Timeline: newTimelinePage(r)}
	rows := r.Rows()
	for _, v := range memory.Views {
		page.Views[v.String()] = flameTree(rows, func(r snapshot.Row) bool { return r.Kind.View() == v })
	}
	views := map[uint32]string{}
	for _, v := range r.TensorViews {
		views[v.PID] = v.String()
	}
	driverOff := map[uint32]string{}
	for _, v := range r.DriverViewsOff {
		driverOff[v.PID] = v.String()
	}
	for _, p := range ByProcessGPU(rows) {
		row := summaryRow{Process: processName(p.Comm, p.PID), PID: p.PID, GPU: p.GPU, Held: p.Held, Tensors: p.Tensors, Segments: p.Segments,
			GraphPool: p.GraphPool, TensorsSince: views[p.PID], DriverOff: driverOff[p.PID]}
		if cache, ok := p.Cache(); ok {
			row.Cache = &cache
		}
		page.Summary = append(page.Summary, row)
	}
	page.Breakdown, page.Parts = breakdownPage(r.Breakdown, rows)
	page.Growing = []string{}
	for _, g := range r.Growing {
		page.Growing = append(page.Growing, GrowingLine(g))
	}
	for _, e := range r.Exhaustion {
		page.Growing = append(page.Growing, ExhaustionLine(e))
	}
	data, err := json.Marshal(page) // escapes <, > and &: safe inside <script>
	if err != nil {
		return err
	}
	_, err = io.WriteString(w, strings.Replace(flameGraphPage, "/*DATA*/", string(data), 1))
	return err
}

// breakdownPage is the breakdowns for the page's stacked bars, and the
// flame graph of each part: its rows'.
func breakdownPage(bs []snapshot.Breakdown, rows []snapshot.Row) ([]htmlBreakdown, map[string]*flameNode) {
	page, parts := []htmlBreakdown{}, map[string]*flameNode{}
	for _, b := range bs {
		h := htmlBreakdown{Process: processName(b.Comm, b.PID), PID: b.PID, GPU: b.GPU, Bytes: b.Bytes(), Of: "the driver view"}
		if b.NVML {
			h.Of = "nvidia-smi"
		}
		for _, p := range b.Parts {
			h.Parts = append(h.Parts, htmlPart{Name: p.Name(), Bytes: p.Bytes})
			keys := map[accounting.Key]bool{}
			for _, k := range p.Keys {
				keys[k] = true
			}
			parts[fmt.Sprintf("%d/%s/%s", b.PID, b.GPU, p.Name())] = flameTree(rows, func(r snapshot.Row) bool { return keys[r.Key] })
		}
		page = append(page, h)
	}
	return page, parts
}

// flameTree is the flame graph of the rows keep says.
func flameTree(rows []snapshot.Row, keep func(snapshot.Row) bool) *flameNode {
	root := &flameNode{Name: "all processes"}
	for _, row := range rows {
		if !keep(row) {
			continue
		}
		process := root.child(processName(row.Comm, row.PID), "")
		node := process.child("[gpu "+row.GPU()+"]", "")
		path := []*flameNode{root, process, node}
		for i := len(row.Frames) - 1; i >= 0; i-- {
			node = node.child(row.Frames[i].Name(), where(*row.Frames[i]))
			path = append(path, node)
		}
		for _, n := range path {
			n.Inuse += row.LiveBytes()
			n.Alloc += row.AllocBytes
		}
	}
	root.sort()
	return root
}

func processName(comm string, pid uint32) string { return fmt.Sprintf("%s (pid %d)", comm, pid) }
