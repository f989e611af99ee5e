package report

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/gpu-mem/gpu-mem/profiler"
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

// WriteHTML writes a self-contained flame graph page (no network access
// when opened): the root is every process, then one bar per process, one
// per device, then the frames from the outermost; live and allocated bytes
// can be switched.
func WriteHTML(w io.Writer, r profiler.Report) error {
	root := &flameNode{Name: "all processes"}
	for _, row := range r.Rows {
		process := root.child(fmt.Sprintf("%s (pid %d)", row.Comm, row.PID), "")
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
	data, err := json.Marshal(root) // escapes <, > and &: safe inside <script>
	if err != nil {
		return err
	}
	_, err = io.WriteString(w, strings.Replace(flameGraphPage, "/*DATA*/", string(data), 1))
	return err
}
