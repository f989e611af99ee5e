package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpu-mem/gpu-mem/journal"
	"github.com/gpu-mem/gpu-mem/tracer"
)

type stateOptions struct {
	stateDir, pinPath string
}

func newStateCommand() *cobra.Command {
	o := &stateOptions{}
	cmd := &cobra.Command{
		Use:   "state clear",
		Short: "Remove the state an agent left on this host: its pinned probes and its journal",
		Long: `An agent with --state-dir leaves its probes pinned and its journal on the host
when it stops, so that the next agent continues its books (a restart, a
rollout, an upgrade). State clear removes both, for a host the agent leaves
for good (helm uninstall): the probes are detached, the journal deleted. It
fails while an agent owns the state.`,
		Example: `  gpumem state clear --state-dir /var/lib/gpu-mem --pin-path /sys/fs/bpf/gpu-mem`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "clear" {
				return usageError{fmt.Errorf("unknown state command %q: want clear", args[0])}
			}
			if o.stateDir == "" {
				return usageError{fmt.Errorf("--state-dir is needed")}
			}
			if err := journal.Clear(o.stateDir); err != nil {
				return err
			}
			if err := tracer.ClearState(o.pinPath); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cleared the state at %s and %s\n", o.stateDir, o.pinPath)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.stateDir, "state-dir", "", "the agent's --state-dir")
	cmd.Flags().StringVar(&o.pinPath, "pin-path", "/sys/fs/bpf/gpu-mem", "the agent's --pin-path")
	return cmd
}
