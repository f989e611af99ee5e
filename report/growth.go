package report

import (
	"fmt"
	"strings"
	"time"

	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// maxGrowingLines is how many growing stacks the status line names, the
// fastest first; the others are counted.
const maxGrowingLines = 5

// exhaustionHorizon is how soon a GPU must run out for the status line to
// say so.
const exhaustionHorizon = time.Hour

// GrowthLines are the status lines of what grows (package growth): one per
// growing stack, the fastest maxGrowingLines, and how many more; one per
// GPU that runs out within the hour at those rates.
func GrowthLines(growing []snapshot.Growing, exhaustion []snapshot.Exhaustion) []string {
	var lines []string
	for i, g := range growing {
		if i == maxGrowingLines {
			lines = append(lines, fmt.Sprintf("growing: %d more stacks", len(growing)-i))
			break
		}
		lines = append(lines, "growing: "+GrowingLine(g))
	}
	for _, e := range exhaustion {
		if seconds(e.Seconds) < exhaustionHorizon {
			lines = append(lines, "exhaustion: "+ExhaustionLine(e))
		}
	}
	return lines
}

// GrowingLine says what grows, where and for how long: pid 4242
// (train.py): +3.1 MiB/min under Trainer.training_step <- train <- <module>
// for 12 min (tensor view, gpu 0).
func GrowingLine(g snapshot.Growing) string {
	return fmt.Sprintf("pid %d (%s): %s under %s for %s (%s view, gpu %s)", g.PID, Printable(g.Comm), Rate(g.BytesPerSecond),
		Printable(StackLine(g.Frames, 3)), Span(g.At.Sub(g.Since)), g.Kind.View(), g.GPU())
}

// ExhaustionLine says when a GPU runs out, at what rate and whose: gpu 0
// runs out in 14 min at +116.0 MiB/s (16.0 GiB free): pid 4242 (train.py)
// 100%.
func ExhaustionLine(e snapshot.Exhaustion) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gpu %d runs out in %s at %s (%s free", e.GPU, Span(seconds(e.Seconds)), Rate(e.BytesPerSecond), HumanBytes(e.Free))
	if e.Slack > 0 {
		fmt.Fprintf(&b, ", %s in allocators' caches", HumanBytes(e.Slack))
	}
	b.WriteString("):")
	for _, p := range e.Processes {
		fmt.Fprintf(&b, " pid %d (%s) %.0f%%", p.PID, Printable(p.Comm), 100*p.Share)
	}
	return b.String()
}

// StackLine names the code a reader acts on (HottestFrame's) and up to
// n-1 of its callers: A <- B <- C.
func StackLine(frames []*symbolize.Frame, n int) string {
	if GraphPoolRow(frames) {
		frames = frames[1:]
	}
	start := min(1, len(frames)) // past the driver's function
	for i, f := range frames {
		if f.File != "" {
			start = i
			break
		}
	}
	frames = frames[start:]
	if len(frames) == 0 {
		return "?"
	}
	names := make([]string, 0, n)
	for _, f := range frames[:min(n, len(frames))] {
		names = append(names, f.Name())
	}
	return strings.Join(names, " <- ")
}

// Rate formats a growth rate: per second from 1 MiB/s, else per minute.
func Rate(bytesPerSecond float64) string {
	if bytesPerSecond >= 1<<20 {
		return "+" + HumanBytes(uint64(bytesPerSecond)) + "/s"
	}
	return "+" + HumanBytes(uint64(bytesPerSecond*60)) + "/min"
}

// Span formats a duration for a reader: 45 s, 12 min, 3 h 5 min.
func Span(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min", int(d.Minutes()))
	}
	return fmt.Sprintf("%d h %d min", int(d.Hours()), int(d.Minutes())%60)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
