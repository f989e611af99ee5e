package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpu-mem/gpu-mem/breakdown"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/pprof"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/report"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

type recordOptions struct {
	target   targetFlags
	duration time.Duration
	value    string
	view     string
	format   string
	output   string
	top      int
	onOOM    string
	oom      *oomWriter // the --on-oom snapshots' writer, once configured
	growth   growthFlags
}

var defaultOutputs = map[string]string{"pprof": "gpumem.pb.gz", "folded": "gpumem.folded", "json": "gpumem.json", "html": "gpumem.html"}

func newRecordCommand() *cobra.Command {
	o := &recordOptions{}
	cmd := &cobra.Command{
		Use:   "record [flags] [-- COMMAND [ARG...]]",
		Short: "Record GPU memory per call stack to a pprof, folded, JSON or HTML file",
		Long: `Record traces every process that uses the CUDA driver (or those of --pid, or
COMMAND, which it starts) until --duration passes, COMMAND exits or Ctrl-C,
then writes what each call stack allocated and still holds, and each
process's peak per GPU and view: the most it held at once, when, and which
stacks held it.

Memory allocated before recording started is not seen, and is not invented:
frees of it are counted as unknown frees.`,
		Example: `  gpumem record --duration 30s -o gpu.pb.gz && go tool pprof -top gpu.pb.gz
  gpumem record --pid 4242 --format folded --value alloc -o gpu.folded
  gpumem record --format folded --view tensor -o tensors.folded   # PyTorch's tensors, not the GPU's memory
  gpumem record --format folded --value peak -o peak.folded   # what held the memory at each process's peak
  gpumem record --duration 1m --format html -o gpu.html   # a flame graph to open in a browser
  gpumem record --library ./libcuda.so.1 -- python train.py
  gpumem record --on-oom oom/ -- python train.py   # what filled the GPU, at each out-of-memory`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), args)
		},
	}
	o.register(cmd.Flags())
	return cmd
}

func (o *recordOptions) register(fs *pflag.FlagSet) {
	o.target.register(fs, profiler.TensorsAll)
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (default: until Ctrl-C or COMMAND exits)")
	fs.StringVar(&o.value, "value", "inuse", "bytes in folded output: inuse (live), alloc (allocated) or peak (each stack's share of its process's peak on its GPU)")
	fs.StringVar(&o.view, "view", "driver", "view in folded output: driver (what the GPU holds) or tensor (PyTorch's tensors, inside the driver's segments)")
	fs.StringVar(&o.format, "format", "pprof", "output format: pprof, folded, json or html (a flame graph and a timeline)")
	fs.StringVarP(&o.output, "output", "o", "", "output file, - for stdout (default gpumem.pb.gz, .folded, .json or .html)")
	fs.IntVar(&o.top, "top", 5, "print the N stacks holding the most to stderr when done (0: none)")
	fs.StringVar(&o.onOOM, "on-oom", "", "at each out-of-memory failure, write what the process held (pprof and folded) into this directory")
	o.growth.register(fs)
}

func (o *recordOptions) validate() error {
	if _, ok := defaultOutputs[o.format]; !ok {
		return usageError{fmt.Errorf("unknown --format %q: want pprof, folded, json or html", o.format)}
	}
	if _, err := report.ParseValue(o.value); err != nil {
		return usageError{fmt.Errorf("--value: %w", err)}
	}
	if _, err := report.ParseView(o.view); err != nil {
		return usageError{fmt.Errorf("--view: %w", err)}
	}
	if o.duration < 0 {
		return usageError{fmt.Errorf("--duration must be positive")}
	}
	if err := o.growth.validate(); err != nil {
		return usageError{err}
	}
	if o.output == "" {
		o.output = defaultOutputs[o.format]
	}
	if o.onOOM != "" {
		// Created if missing, then checked as -o is: a snapshot that
		// could never be written is said now, not at the first failure.
		if err := os.MkdirAll(o.onOOM, 0o755); err != nil {
			return usageError{fmt.Errorf("--on-oom %s: %w", o.onOOM, cause(err))}
		}
		if err := checkFolder("--on-oom "+o.onOOM, o.onOOM); err != nil {
			return usageError{err}
		}
	}
	return nil
}

// config is the profiler's configuration for these flags.
func (o *recordOptions) config() profiler.Config {
	cfg := o.target.config()
	cfg.Timeline = o.format == "html" // the report's timeline; the other formats have none
	if o.onOOM != "" {
		o.oom = &oomWriter{dir: o.onOOM, rules: o.target.rules.get()}
		cfg.OnOOM = o.oom.write
	}
	return cfg
}

func (o *recordOptions) run(ctx context.Context, command []string) error {
	if err := o.validate(); err != nil {
		return err
	}
	// Ctrl-C handled from the start: it may come as soon as the driver is
	// attached (logged by New), and stops the recording with its report.
	ctx, stop := untilStopped(ctx, 0)
	defer stop()
	p, err := profiler.New(o.config())
	if err != nil {
		return err
	}
	defer p.Close()
	// --duration is of recording, counted once attached: loading the
	// program takes seconds on a slow host, which a short recording (the
	// demo's 3 s) would otherwise lose to it.
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	// After New, which says first if gpumem may trace at all; before
	// anything is recorded that a bad -o would lose.
	if err := checkOutput(o.output); err != nil {
		return usageError{err}
	}
	var child *exec.Cmd
	if len(command) > 0 {
		if child, err = startCommand(command); err != nil {
			return err
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		go func() { child.Wait(); cancel() }()
		go p.Watch(ctx, child.Process.Pid)
	}

	logs.Event(log, logs.Recording, "recording; Ctrl-C to stop")
	following := make(chan struct{})
	followCtx, stopFollowing := context.WithCancel(ctx)
	go func() {
		o.growth.follow(followCtx, p, o.target.rules.get())
		close(following)
	}()
	err = p.Run(ctx)
	stopFollowing()
	<-following
	if err != nil {
		return err
	}
	if o.oom != nil {
		o.oom.summary()
	}
	r, err := p.Snapshot()
	if err != nil {
		logf("reading loss counters: %v", err)
	}
	breakdown.Fill(r, o.target.rules.get())
	r.Growing, r.Exhaustion = o.growth.last.Growing, o.growth.last.Exhaustion // the last interval's
	if child != nil && child.ProcessState == nil {
		child.Process.Signal(syscall.SIGTERM)
	}
	if err := o.write(r); err != nil {
		return err
	}
	if o.top > 0 {
		writeStacks(r, o.top)
	}
	return nil
}

func startCommand(command []string) (*exec.Cmd, error) {
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", command[0], err)
	}
	return cmd, nil
}

func (o *recordOptions) write(r *snapshot.Snapshot) error {
	ext := strings.TrimPrefix(defaultOutputs[o.format], "gpumem") // .pb.gz, .folded, ...
	written, err := writeReport(o.output, ext, func(w io.Writer) error {
		switch o.format {
		case "pprof":
			return pprof.Write(w, r, pprof.Comment(r)...)
		case "folded":
			view, _ := report.ParseView(o.view) // checked by validate
			return report.WriteFolded(w, r, report.Value(o.value), view)
		case "json":
			return report.WriteJSON(w, r)
		default: // html, checked by validate
			return report.WriteHTML(w, r)
		}
	})
	if written != "-" && written != "" {
		logf("wrote %s (%d stacks)", written, r.Len())
	}
	return err
}
