// Package report writes GPU memory reports for people and scripts: folded
// stacks for flame graphs, JSON, and the table of `gpumem top`.
package report

import (
	"bufio"
	"fmt"
	"io"
	"iter"
	"sort"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// Value selects the number a folded line carries.
type Value string

const (
	InUse     Value = "inuse" // live bytes
	Allocated Value = "alloc" // bytes allocated since tracing began
	Peak      Value = "peak"  // each stack's share of its process's peak on its GPU
)

// ParseView checks a --view flag.
func ParseView(s string) (memory.View, error) {
	if v, ok := memory.ParseView(s); ok {
		return v, nil
	}
	return 0, fmt.Errorf("unknown view %q: want driver or tensor", s)
}

// ParseValue checks a --value flag.
func ParseValue(s string) (Value, error) {
	switch v := Value(s); v {
	case InUse, Allocated, Peak:
		return v, nil
	}
	return "", fmt.Errorf("unknown value %q: want inuse, alloc or peak", s)
}

// WriteFolded writes the rows of one view, one line per distinct stack,
// frames outermost first and separated by ';', then a space and the bytes.
// The process name is the outermost frame, then where the memory lives
// ("gpu=0", "gpu=host"), so that processes and devices stay apart in a
// flame graph. Stacks with no bytes are left out. One view only: a tensor's
// bytes are also in the driver's segment that holds it. With Peak, the rows
// are those of each process's peak on each GPU, each with its share: a
// process's lines on one GPU sum to its peak there (two processes of one
// name are summed, their peaks reached at different moments).
func WriteFolded(w io.Writer, r *snapshot.Snapshot, v Value, view memory.View) error {
	sums := map[string]uint64{}
	for row, bytes := range foldedRows(r, v, view) {
		if bytes == 0 {
			continue
		}
		names := make([]string, 0, len(row.Frames)+2)
		names = append(names, row.Comm, "gpu="+row.GPU())
		for i := len(row.Frames) - 1; i >= 0; i-- {
			names = append(names, row.Frames[i].Name())
		}
		sums[schema.JoinFolded(names)] += bytes
	}
	lines := make([]string, 0, len(sums))
	for stack := range sums {
		lines = append(lines, stack)
	}
	sort.Strings(lines)
	bw := bufio.NewWriter(w)
	for _, stack := range lines {
		fmt.Fprintf(bw, "%s %d\n", stack, sums[stack])
	}
	return bw.Flush()
}

// foldedRows yields the rows of view v in a report with the bytes that
// value v gives each.
func foldedRows(r *snapshot.Snapshot, v Value, view memory.View) iter.Seq2[*snapshot.Row, uint64] {
	return func(yield func(*snapshot.Row, uint64) bool) {
		if v == Peak {
			for i := range r.Peaks {
				if r.Peaks[i].View != view {
					continue
				}
				for j := range r.Peaks[i].Rows {
					if row := &r.Peaks[i].Rows[j]; !yield(row, row.LiveBytes()) {
						return
					}
				}
			}
			return
		}
		rows := r.Rows()
		for i := range rows {
			row := &rows[i]
			if row.Kind.View() != view {
				continue
			}
			bytes := row.LiveBytes()
			if v == Allocated {
				bytes = row.AllocBytes
			}
			if !yield(row, bytes) {
				return
			}
		}
	}
}
