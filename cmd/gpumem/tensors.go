package main

import (
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpu-mem/gpu-mem/control"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

type tensorsOptions struct {
	socket string
	length time.Duration
	budget string // empty: the agent's --tensor-budget
}

func newTensorsCommand() *cobra.Command {
	o := &tensorsOptions{}
	cmd := &cobra.Command{
		Use:   "tensors on PID | off PID | list",
		Short: "Switch a process's tensor view on or off in the running agent",
		Long: `Tensors asks the agent running on this host, through its control socket, to
switch the tensor view (PyTorch's tensors, one probe hit per torch.empty and
free) of one process on or off while the agent and the process run. The agent
traces the driver view of every process by default; the tensor view costs
its process a few microseconds a tensor, so it is switched on where it is
wanted and only there: the other processes pay nothing. Every output says
from when a process's tensor view holds; tensors made before are charged to
no one. A view that costs its process more than its budget (the agent's
--tensor-budget, 2% of its time, unless --budget gives it one of its own) is
switched off. In Kubernetes, annotate the pod instead: gpu-mem.io/tensors:
"true" (and optionally gpu-mem.io/tensors-until: an RFC 3339 time,
gpu-mem.io/tensors-budget: a share).`,
		Example: `  gpumem tensors on 4242 --for 10m
  gpumem tensors on 4242 --for 10m --budget 25%
  gpumem tensors list
  gpumem tensors off 4242`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(args) },
	}
	cmd.Flags().StringVar(&o.socket, "control-socket", control.DefaultSocket, "the agent's control socket")
	cmd.Flags().DurationVar(&o.length, "for", 0, "switch off again after this long (default: until switched off)")
	cmd.Flags().StringVar(&o.budget, "budget", "", "the most of the process's time its view may cost, a share (0.25) or a percentage (25%); 0: no budget (default: the agent's --tensor-budget)")
	return cmd
}

func (o *tensorsOptions) run(args []string) error {
	c := control.Dial(o.socket)
	if args[0] == "list" {
		if len(args) != 1 {
			return usageError{fmt.Errorf("list takes no PID")}
		}
		return o.list(c)
	}
	if len(args) != 2 {
		return usageError{fmt.Errorf("%s needs a PID", args[0])}
	}
	pid, err := strconv.Atoi(args[1])
	if err != nil || pid <= 0 {
		return usageError{fmt.Errorf("not a PID: %q", args[1])}
	}
	switch args[0] {
	case "on":
		if o.length < 0 {
			return usageError{fmt.Errorf("--for: want a positive duration, got %v", o.length)}
		}
		var budget *float64
		if o.budget != "" {
			share, err := snapshot.ParseBudget(o.budget)
			if err != nil {
				return usageError{fmt.Errorf("--budget: %w", err)}
			}
			budget = &share
		}
		return c.SetTensors(pid, o.length, budget)
	case "off":
		return c.StopTensors(pid)
	}
	return usageError{fmt.Errorf("want on, off or list, got %q", args[0])}
}

func (o *tensorsOptions) list(c *control.Client) error {
	views, err := c.TensorViews()
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PID\tBY\tBUDGET\tSINCE\tUNTIL\tENDED\tWHY")
	for _, v := range views {
		since := "waiting for PyTorch's allocator"
		if !v.Since.IsZero() {
			since = v.Since.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", v.PID, v.By, percentBudget(v.Budget), since, stamp(v.Until), stamp(v.Ended), v.Why)
	}
	return w.Flush()
}

// percentBudget is a view's budget as a percentage, or "none".
func percentBudget(share float64) string {
	if share == 0 {
		return "none"
	}
	return strconv.FormatFloat(100*share, 'g', -1, 64) + "%"
}

// stamp is t in RFC 3339, or "-" for none.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Format(time.RFC3339)
}
