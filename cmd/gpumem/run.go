//go:build !lean

package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	gadgetcontext "github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-context"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-service/api"
	apihelpers "github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-service/api-helpers"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/logger"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/operators"
	ocihandler "github.com/inspektor-gadget/inspektor-gadget/pkg/operators/oci-handler"

	"github.com/gpu-mem/gpu-mem/operators/gpumem"
	"github.com/gpu-mem/gpu-mem/operators/k8smeta"
	"github.com/gpu-mem/gpu-mem/operators/pyroscope"
	"github.com/gpu-mem/gpu-mem/profiledata"
	"github.com/gpu-mem/gpu-mem/profiler"
)

type runOptions struct {
	record     recordOptions
	interval   time.Duration
	pyroscope  string
	kubeconfig string
	verify     bool
	publicKeys []string
}

func newRunCommand() *cobra.Command {
	o := &runOptions{}
	cmd := &cobra.Command{
		Use:   "run IMAGE [flags]",
		Short: "Run a gpu-mem gadget image through Inspektor Gadget's runtime, with gpumem's attach",
		Long: `Run takes a gadget image from IG's local store (gpumem image build, or
gpumem image import) and runs it in Inspektor Gadget's runtime, as ig run
does: IG's OCI handler reads the image, and gpumem's image operator loads the
image's eBPF object with its own uprobe attach, which needs no kprobes. The
profile rows then go through the same data operators as on a cluster node
(Kubernetes names, Pyroscope export) and, at the end, to a file as with
gpumem record.`,
		Example: `  gpumem run gpu-mem:dev --duration 30s -o gpu.pb.gz
  gpumem run gpu-mem:dev --pyroscope-url http://pyroscope:4040 --interval 15s`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), args[0])
		},
	}
	fs := cmd.Flags()
	o.record.register(fs)
	fs.DurationVar(&o.interval, "interval", 5*time.Second, "how often the books go to the data operators")
	fs.StringVar(&o.pyroscope, "pyroscope-url", "", "also push every interval to this Pyroscope server")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "name pods from this API server")
	fs.BoolVar(&o.verify, "verify-image", false, "verify the image's signature (cosign) with --public-key")
	fs.StringSliceVar(&o.publicKeys, "public-key", nil, "PEM public key to verify signatures with (repeatable)")
	return cmd
}

func (o *runOptions) run(ctx context.Context, image string) error {
	if o.record.onOOM != "" {
		return usageError{fmt.Errorf("--on-oom is record's: gpumem run carries profile rows only")}
	}
	if err := o.record.validate(); err != nil {
		return err
	}
	if o.interval <= 0 {
		return usageError{fmt.Errorf("--interval must be positive")}
	}
	// The one operator for eBPF layers: gpumem's, not IG's.
	operators.RegisterOperatorForMediaType(gpumem.MediaType, gpumem.Operator{Log: log})
	out := &profiledata.Last{}
	ctx, stop := untilStopped(ctx, o.record.duration)
	defer stop()
	gadgetCtx := gadgetcontext.New(ctx, image,
		gadgetcontext.WithDataOperators(ocihandler.OciHandler, k8smeta.Operator{}, pyroscope.Operator{}, out.Operator(pyroscope.Priority+1)),
		gadgetcontext.WithLogger(logger.DefaultLogger()))
	if err := o.initOCIHandler(); err != nil {
		return err
	}
	params := api.ParamValues{
		"operator.oci.gpumem." + gpumem.ParamLibrary:  o.record.target.library,
		"operator.oci.gpumem." + gpumem.ParamPIDs:     joinInts(o.record.target.pids),
		"operator.oci.gpumem." + gpumem.ParamGPUs:     joinInts(o.record.target.gpus),
		"operator.oci.gpumem." + gpumem.ParamInterval: o.interval.String(),
		"operator.oci.gpumem." + gpumem.ParamTensors:  strconv.FormatBool(o.record.target.tensors != tensorScope(profiler.TensorsOff)),
		"operator.pyroscope." + pyroscope.ParamURL:    o.pyroscope,
		"operator.k8smeta." + k8smeta.ParamKubeconfig: o.kubeconfig,
	}
	logf("running %s; Ctrl-C to stop", image)
	if err := gadgetCtx.Run(params); err != nil {
		return fmt.Errorf("run %s: %w", image, err)
	}
	r, ok := out.Get()
	if !ok {
		return fmt.Errorf("%s produced no gpu-mem profile: is it a gpu-mem image?", image)
	}
	if err := o.record.write(r); err != nil {
		return err
	}
	if o.record.top > 0 {
		writeStacks(r, o.record.top)
	}
	return nil
}

// initOCIHandler sets IG's global image options. Signatures are checked
// only on request: a locally built image carries none.
func (o *runOptions) initOCIHandler() error {
	globals := apihelpers.ToParamDescs(ocihandler.OciHandler.GlobalParams()).ToParams()
	if err := globals.Set("verify-image", strconv.FormatBool(o.verify)); err != nil {
		return err
	}
	if len(o.publicKeys) > 0 {
		if err := globals.Set("public-keys", strings.Join(o.publicKeys, ",")); err != nil {
			return err
		}
	}
	if err := ocihandler.OciHandler.Init(globals); err != nil {
		return fmt.Errorf("IG's OCI handler: %w", err)
	}
	return nil
}

func joinInts(list []int) string {
	s := make([]string, len(list))
	for i, n := range list {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
