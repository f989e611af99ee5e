// Command gpumem profiles GPU memory: which code, in which process, holds how
// much memory through the CUDA driver, with no change to the program.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/report"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// Exit codes: 1 for failures while running, 2 for what the user must fix
// before running (flags, permissions).
const (
	exitFailure = 1
	exitUsage   = 2
)

// usageError marks an error in the command line.
type usageError struct{ error }

func main() {
	if err := newRootCommand().Execute(); err != nil {
		log.Error(err.Error())
		os.Exit(exitCode(err))
	}
}

// newRootCommand is gpumem's command tree, also what docs/reference/cli is
// generated from.
func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "gpumem",
		Short:         "GPU memory profiler: live and allocated GPU memory per call stack",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&logFormat, "log-format", "text",
		"the log's form on stderr: text (a sentence a line) or json (an object a line, its milestones as events: docs/logs.md)")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		l, err := logs.New(os.Stderr, logFormat)
		if err != nil {
			return usageError{err}
		}
		log = l
		return nil
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w\n\n%s", err, cmd.UsageString())}
	})
	root.AddCommand(newRecordCommand(), newTopCommand(), newAgentCommand(), newTensorsCommand(), newStateCommand())
	root.AddCommand(fullCommands()...)
	return root
}

func exitCode(err error) int {
	var usage usageError
	if errors.As(err, &usage) || errors.Is(err, tracer.ErrPermission) || errors.Is(err, profiler.ErrNoProcess) {
		return exitUsage
	}
	return exitFailure
}

// log writes gpumem's log in --log-format's form (logFormat); text until
// the flags are read, so that an error in them is said as before.
var (
	logFormat = "text"
	log, _    = logs.New(os.Stderr, logFormat)
)

// writeStacks writes the stacks holding the most to stderr: as they are
// beside a text log, as the sentence of one line in a json log.
func writeStacks(r *snapshot.Snapshot, top int) {
	if logFormat == "text" {
		report.WriteStacks(os.Stderr, r, top)
		return
	}
	var b strings.Builder
	report.WriteStacks(&b, r, top)
	log.Info(strings.TrimSuffix(b.String(), "\n"))
}

// logf logs a sentence of no event.
func logf(format string, args ...any) {
	logs.Printf(log, format, args...)
}

// untilStopped is ctx, done at Ctrl-C or SIGTERM, or after duration when
// it is positive.
func untilStopped(ctx context.Context, duration time.Duration) (context.Context, context.CancelFunc) {
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	if duration <= 0 {
		return ctx, stopSignals
	}
	ctx, cancel := context.WithTimeout(ctx, duration)
	return ctx, func() { cancel(); stopSignals() }
}
