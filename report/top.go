package report

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// TopRow is one line of `gpumem top`: one process, kind of memory and device.
type TopRow struct {
	PID       uint32
	Comm      string
	Kind      memory.Kind
	GPU       string
	Pod       string // namespace/pod, the pod UID, or "-"
	Live      uint64
	Allocated uint64
	Allocs    uint64
	Frees     uint64 // explicit and at exit
	Failures  uint64
	Growth    uint64 // what its growing stacks grew over the detection window (package growth)
	Hottest   string // the caller of the driver on the stack holding most
	hottest   uint64
}

// Top folds a report's stacks into one row per process, kind and device,
// sorted by live bytes; growing are the stacks growing (growth.Detector).
func Top(r *snapshot.Snapshot, growing []snapshot.Growing) []TopRow {
	grew := map[accounting.Key]uint64{}
	for _, g := range growing {
		grew[g.Key] = g.Grew
	}
	type key struct {
		pid  uint32
		kind memory.Kind
		gpu  string
	}
	rows := map[key]*TopRow{}
	get := func(pid uint32, comm string, kind memory.Kind, gpu string, c container.Identity) *TopRow {
		k := key{pid, kind, gpu}
		if rows[k] == nil {
			rows[k] = &TopRow{PID: pid, Comm: comm, Kind: kind, GPU: gpu, Pod: podName(c)}
		}
		return rows[k]
	}
	for _, s := range r.Rows() {
		t := get(s.PID, s.Comm, s.Kind, s.GPU(), s.Container)
		t.Live += s.LiveBytes()
		t.Allocated += s.AllocBytes
		t.Allocs += s.AllocCount
		t.Frees += s.FreeCount + s.ImplicitFreeCount
		t.Growth += grew[s.Key]
		weight := s.LiveBytes()
		if t.Hottest == "" || weight > t.hottest {
			t.Hottest, t.hottest = HottestFrame(s.Frames), weight
		}
	}
	for _, f := range r.Failures {
		get(f.PID, f.Comm, f.Kind, f.GPU(), container.Identity{}).Failures += f.Count
	}
	out := make([]TopRow, 0, len(rows))
	for _, t := range rows {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Live != out[j].Live {
			return out[i].Live > out[j].Live
		}
		if out[i].Allocated != out[j].Allocated {
			return out[i].Allocated > out[j].Allocated
		}
		return out[i].PID < out[j].PID
	})
	return out
}

// HottestFrame names the code a reader acts on: the innermost Python frame,
// else the native frame that called the driver (frame 0 is the driver
// function itself, after a graph pool's mark).
func HottestFrame(frames []*symbolize.Frame) string {
	if GraphPoolRow(frames) {
		frames = frames[1:]
	}
	for _, f := range frames {
		if f.File != "" {
			return f.Name()
		}
	}
	if len(frames) > 1 {
		return frames[1].Name()
	}
	if len(frames) == 1 {
		return frames[0].Name()
	}
	return "?"
}

// WriteTop writes a status line, each view's total, what NVML says, a
// line per process and GPU with its breakdown, the table of Top, at
// most limit rows (all when limit <= 0), the three stacks growing fastest
// (growing, the last detection's, package growth), the table of peaks (at
// most limit rows a view), and the latest out-of-memory.
func WriteTop(w io.Writer, r *snapshot.Snapshot, limit int, growing []snapshot.Growing) error {
	fmt.Fprintf(w, "gpumem %s  events %d  losses %d  unknown frees %d  libraries %d\n",
		r.Time.Format("15:04:05"), r.Events, r.Losses.Total(), r.Ledger.UnknownFrees, len(r.Libraries))
	for _, v := range r.TensorViews {
		fmt.Fprintln(w, v.String())
	}
	for _, v := range r.DriverViewsOff {
		fmt.Fprintln(w, v.String())
	}
	named := r.Rows()
	writeViewTotals(w, named)
	writeGPUMemory(w, r.GPUMemory)
	writeBreakdowns(w, r.Breakdown)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "PID\tCOMM\tPOD\tKIND\tGPU\tLIVE\tGROWING\tALLOCATED\tALLOCS\tFREES\tFAILURES\t HOTTEST FRAME\n")
	rows := Top(r, growing)
	if limit > 0 && len(rows) > limit {
		rows = rows[:limit]
	}
	for _, t := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t %s\n", t.PID, Printable(t.Comm), Printable(t.Pod), t.Kind, t.GPU,
			HumanBytes(t.Live), growingBytes(t.Growth), HumanBytes(t.Allocated), t.Allocs, t.Frees, t.Failures, Printable(t.Hottest))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, g := range growing[:min(3, len(growing))] {
		fmt.Fprintf(w, "growing: %s\n", GrowingLine(g))
	}
	if err := writePeakTable(w, r, named, limit); err != nil {
		return err
	}
	if len(r.OOMs) > 0 {
		o := r.OOMs[len(r.OOMs)-1]
		fmt.Fprintf(w, "%s %s\n", o.Time.Format("15:04:05"), DescribeOOM(o))
	}
	return nil
}

// writeViewTotals writes one line per view with its live and allocated
// bytes; the tensor view's only when tensors were traced. The kinds under
// each are in the table's KIND column (tensor: the tensor view).
func writeViewTotals(w io.Writer, rows []snapshot.Row) {
	for _, v := range memory.Views {
		if v == memory.ViewTensor && !HasTensors(rows) {
			continue
		}
		sum := ViewTotal(rows, v)
		fmt.Fprintf(w, "%s: %s live, %s allocated%s\n", ViewName(v), HumanBytes(sum.LiveBytes()), HumanBytes(sum.AllocBytes), viewNote(v))
	}
}

// viewNote says, after a view's total, why it is not added to the other.
func viewNote(v memory.View) string {
	if v == memory.ViewTensor {
		return " (inside the driver view's segments: not added to it)"
	}
	return ""
}

// growingBytes is the GROWING column: what a row's growing stacks grew,
// "-" if none grows.
func growingBytes(n uint64) string {
	if n == 0 {
		return "-"
	}
	return "+" + HumanBytes(n)
}

// HumanBytes formats a byte count with binary units: 1.5 MiB.
func HumanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// WriteStacks writes, per view, the n stacks holding the most, each as a
// backtrace (innermost first) under its live and allocated bytes, and the n
// highest peaks of processes on GPUs beside what they hold now, then each
// view's total (the tensor view only when tensors were traced), what NVML
// says, and each process's breakdown when the snapshot has one.
func WriteStacks(w io.Writer, r *snapshot.Snapshot, n int) error {
	rows := r.Rows()
	for _, v := range memory.Views {
		if v == memory.ViewTensor && !HasTensors(rows) {
			continue
		}
		fmt.Fprintf(w, "%s, stacks holding the most:\n", ViewName(v))
		shown := 0
		for _, row := range rows { // by live bytes
			if row.Kind.View() != v || shown == n {
				continue
			}
			shown++
			fmt.Fprintf(w, "%s live, %s allocated by %d calls: pid %d (%s), %s memory, gpu %s\n",
				HumanBytes(row.LiveBytes()), HumanBytes(row.AllocBytes), row.AllocCount, row.PID, Printable(row.Comm), row.Kind, row.GPU())
			for _, f := range row.Frames {
				fmt.Fprintf(w, "    %s\n", Printable(f.Name()))
			}
		}
		writeViewPeaks(w, r, rows, v, n)
	}
	writeViewTotals(w, rows)
	writeGPUMemory(w, r.GPUMemory)
	if len(r.Breakdown) > 0 {
		fmt.Fprintln(w, "where the GPU memory went (docs/breakdown.md):")
		writeBreakdowns(w, r.Breakdown)
	}
	_, err := fmt.Fprintf(w, "events %d, losses %d, unknown frees %d\n", r.Events, r.Losses.Total(), r.Ledger.UnknownFrees)
	return err
}

// podName is how top names a process's pod.
func podName(c container.Identity) string {
	switch {
	case c.Pod != "":
		return c.Namespace + "/" + c.Pod
	case c.PodUID != "":
		return c.PodUID
	}
	return "-"
}
