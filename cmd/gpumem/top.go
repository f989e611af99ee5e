package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/gpu-mem/gpu-mem/breakdown"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/report"
)

type topOptions struct {
	target   targetFlags
	interval time.Duration
	duration time.Duration
	limit    int
	growth   growthFlags
}

func newTopCommand() *cobra.Command {
	o := &topOptions{}
	cmd := &cobra.Command{
		Use:   "top [flags]",
		Short: "Show GPU memory per process and kind, live, refreshed every second",
		Long: `Top shows one row per process and kind of memory (device, host-pinned, managed,
vmm, and tensor for PyTorch's allocator), sorted by live bytes, under each
view's total: GPU memory (the driver view, every kind but tensor) and
tensors (the tensor view, inside the driver's segments: never added to it),
with the function that called the driver on the
stack holding the most, and what its growing stacks grew: a stack grows when
the least it held in an interval (--growth-interval) rose in each of the last
--growth-intervals intervals, as the agent finds them; the three growing
fastest are below, with their rate and for how long. Below them, each process's peak per GPU and view
since top started: the most it held at once, when, and the function that
held the most then, beside what it holds now. The latest out-of-memory, if
any, is the last line. On a terminal the screen is redrawn; otherwise each refresh prints
plain lines.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	o.target.register(fs, profiler.TensorsAll)
	fs.DurationVar(&o.interval, "interval", time.Second, "refresh interval")
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (default: until Ctrl-C)")
	fs.IntVar(&o.limit, "limit", 20, "rows shown (0: all)")
	o.growth.register(fs)
	return cmd
}

func (o *topOptions) run(ctx context.Context) error {
	if o.interval <= 0 {
		return usageError{fmt.Errorf("--interval must be positive")}
	}
	if err := o.growth.validate(); err != nil {
		return usageError{err}
	}
	// Ctrl-C handled from the start: it may come as soon as the driver is
	// attached (logged by New).
	ctx, stop := untilStopped(ctx, o.duration)
	defer stop()
	p, err := profiler.New(o.target.config())
	if err != nil {
		return err
	}
	defer p.Close()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	interactive := term.IsTerminal(int(os.Stdout.Fd()))
	ticker := time.NewTicker(o.interval)
	defer ticker.Stop()
	growthTicker := time.NewTicker(o.growth.interval)
	defer growthTicker.Stop()
	for {
		select {
		case err := <-done:
			if err == nil {
				err = o.draw(p, interactive)
			}
			return err
		case <-ticker.C:
			if err := o.draw(p, interactive); err != nil {
				return err
			}
		case <-growthTicker.C:
			o.growth.endInterval(p, o.target.rules.get())
		}
	}
}

// draw draws one screen; the processes that exited before it, drawn, are
// dropped.
func (o *topOptions) draw(p *profiler.Profiler, interactive bool) error {
	s, err := p.Snapshot()
	if err != nil {
		logf("reading loss counters: %v", err)
	}
	defer p.DropExited(s)
	if interactive {
		fmt.Print("\033[H\033[2J")
	}
	breakdown.Fill(s, o.target.rules.get())
	return report.WriteTop(os.Stdout, s, o.limit, o.growth.last.Growing)
}
