package report

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// Peaks, for people: each process's most memory at once on a GPU, per
// view, beside what it holds now. The peaks of two processes, or of one
// process on two GPUs, came at different moments: no line adds them.

// PeakTimeFormat is how outputs for people say when a peak was reached.
const PeakTimeFormat = "15:04:05.000"

// PeaksOf are the peaks of view v, by bytes, descending, then by PID and
// GPU.
func PeaksOf(peaks []snapshot.Peak, v memory.View) []snapshot.Peak {
	var out []snapshot.Peak
	for _, pk := range peaks {
		if pk.View == v {
			out = append(out, pk)
		}
	}
	slices.SortStableFunc(out, func(a, b snapshot.Peak) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(a.PID, b.PID), cmp.Compare(a.GPU, b.GPU))
	})
	return out
}

// LiveAt is what process pid holds now on gpu in view v: its peak's
// counterpart at the report's time.
func LiveAt(rows []snapshot.Row, pid uint32, gpu string, v memory.View) uint64 {
	var live uint64
	for _, row := range rows {
		if row.PID == pid && row.Kind.View() == v && row.GPU() == gpu {
			live += row.LiveBytes()
		}
	}
	return live
}

// PeakHolder names the stack holding the most at a peak, as top's hottest
// frame does, with its bytes; "-" for a peak without rows.
func PeakHolder(pk snapshot.Peak) (string, uint64) {
	if len(pk.Rows) == 0 {
		return "-", 0
	}
	return HottestFrame(pk.Rows[0].Frames), pk.Rows[0].LiveBytes() // rows by bytes, descending
}

// DescribePeak is one line: how much, when, whose, what is live now, and
// the stack that held the most then.
func DescribePeak(pk snapshot.Peak, live uint64) string {
	by, bytes := PeakHolder(pk)
	return fmt.Sprintf("%s peak at %s, pid %d (%s), gpu %s (%s live now); most (%s) by %s",
		HumanBytes(pk.Bytes), pk.Time.Format(PeakTimeFormat), pk.PID, Printable(pk.Comm), pk.GPU, HumanBytes(live), HumanBytes(bytes), Printable(by))
}

// writeViewPeaks writes at most n peaks of view v, one line each, under a
// heading; nothing when the view has none.
func writeViewPeaks(w io.Writer, r *snapshot.Snapshot, rows []snapshot.Row, v memory.View, n int) {
	peaks := PeaksOf(r.Peaks, v)
	if len(peaks) == 0 {
		return
	}
	fmt.Fprintf(w, "%s, peaks (the most each process held at once on a GPU; never added):\n", ViewName(v))
	for _, pk := range peaks[:min(n, len(peaks))] {
		fmt.Fprintf(w, "%s\n", DescribePeak(pk, LiveAt(rows, pk.PID, pk.GPU, v)))
	}
}

// writePeakTable writes top's table of peaks: per process, GPU and view,
// the peak since top started, when, and what held the most then, beside
// what is live now; driver view first, at most limit rows of each view
// (all when limit <= 0).
func writePeakTable(w io.Writer, r *snapshot.Snapshot, rows []snapshot.Row, limit int) error {
	if len(r.Peaks) == 0 {
		return nil
	}
	fmt.Fprintln(w, "peaks since start (the most each process held at once, per GPU and view; never added):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "PID\tCOMM\tPOD\tGPU\tVIEW\tLIVE\tPEAK\tPEAK AT\t MOST AT PEAK\n")
	for _, v := range memory.Views {
		peaks := PeaksOf(r.Peaks, v)
		if limit > 0 && len(peaks) > limit {
			peaks = peaks[:limit]
		}
		for _, pk := range peaks {
			by, bytes := PeakHolder(pk)
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t %s (%s)\n", pk.PID, Printable(pk.Comm), Printable(podName(pk.Container)), pk.GPU, v,
				HumanBytes(LiveAt(rows, pk.PID, pk.GPU, v)), HumanBytes(pk.Bytes), pk.Time.Format(PeakTimeFormat), Printable(by), HumanBytes(bytes))
		}
	}
	return tw.Flush()
}
