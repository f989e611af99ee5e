// Package gpumem is the Inspektor Gadget image operator that runs a gpu-mem
// gadget image with gpumem's own attach: it takes the image's eBPF object
// (the layer IG's eBPF operator would take), loads it with uprobe_multi
// links where IG's uprobe attach needs kprobes, keeps the books in user
// space, and emits them as profile rows (schema) for the data
// operators: operators/k8smeta, operators/pyroscope, or any other.
package gpumem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"

	"github.com/inspektor-gadget/inspektor-gadget/pkg/datasource"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-service/api"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/oci"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/operators"

	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/profiledata"
	"github.com/gpu-mem/gpu-mem/profiler"
)

const (
	// Name is the operator's name; under IG's OCI handler its parameters
	// are operator.oci.gpumem.*.
	Name = "gpumem"
	// DataSource is the name of the data source of profile rows;
	// StatsDataSource, of the totals emitted before each array of rows.
	DataSource      = "gpumem"
	StatsDataSource = "gpumem-stats"
	// MediaType is the image layer it runs: a gadget's eBPF object.
	MediaType = "application/vnd.gadget.ebpf.program.v1+binary"

	ParamLibrary  = "library"
	ParamPIDs     = "pid"
	ParamGPUs     = "gpu"
	ParamInterval = "interval"
	ParamTensors  = "tensors"
)

var params = api.Params{
	{Key: ParamLibrary, Description: "attach to this driver library only, instead of finding every libcuda.so* mapped by a process"},
	{Key: ParamPIDs, Description: "trace only these processes (comma-separated)"},
	{Key: ParamGPUs, Description: "report only memory on these device ordinals (comma-separated)"},
	{Key: ParamInterval, DefaultValue: "5s", TypeHint: api.TypeDuration, Description: "how often the books are emitted"},
	{Key: ParamTensors, DefaultValue: "true", TypeHint: api.TypeBool, Description: "also trace PyTorch's caching allocator: the tensor view"},
}

// Operator is the image operator. Register it for MediaType in place of
// IG's eBPF operator (the registry holds one operator per media type).
type Operator struct {
	// Log receives the profiler's progress messages; nil: IG's logger.
	Log *slog.Logger
}

func (Operator) Name() string { return Name }

// InstantiateImageOperator reads the object and registers the data source;
// nothing is loaded until Start.
func (o Operator) InstantiateImageOperator(gadgetCtx operators.GadgetContext, target oras.ReadOnlyTarget,
	desc ocispec.Descriptor, values api.ParamValues,
) (operators.ImageOperatorInstance, error) {
	r, err := oci.GetContentFromDescriptor(gadgetCtx.Context(), target, desc)
	if err != nil {
		return nil, fmt.Errorf("get eBPF object: %w", err)
	}
	defer r.Close()
	object, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read eBPF object: %w", err)
	}
	cfg, interval, err := configFrom(values)
	if err != nil {
		return nil, err
	}
	cfg.Object = object
	cfg.Log = o.Log
	if cfg.Log == nil {
		cfg.Log = logs.To(func(l logs.Line) { gadgetCtx.Logger().Info(l.Msg) })
	}
	ds, err := gadgetCtx.RegisterDataSource(datasource.TypeArray, DataSource)
	if err != nil {
		return nil, err
	}
	rows, err := profiledata.NewWriter(ds)
	if err != nil {
		return nil, err
	}
	statsDS, err := gadgetCtx.RegisterDataSource(datasource.TypeSingle, StatsDataSource)
	if err != nil {
		return nil, err
	}
	stats, err := profiledata.NewStatsWriter(statsDS)
	if err != nil {
		return nil, err
	}
	return &instance{cfg: cfg, interval: interval, rows: rows, stats: stats}, nil
}

func configFrom(values api.ParamValues) (profiler.Config, time.Duration, error) {
	cfg := profiler.Config{Library: values[ParamLibrary]}
	var err error
	if cfg.PIDs, err = ints(values[ParamPIDs]); err != nil {
		return cfg, 0, fmt.Errorf("%s: %w", ParamPIDs, err)
	}
	if cfg.GPUs, err = ints(values[ParamGPUs]); err != nil {
		return cfg, 0, fmt.Errorf("%s: %w", ParamGPUs, err)
	}
	if values[ParamTensors] == "false" {
		cfg.Tensors = profiler.TensorsOff
	}
	interval := 5 * time.Second
	if v := values[ParamInterval]; v != "" {
		if interval, err = time.ParseDuration(v); err != nil || interval <= 0 {
			return cfg, 0, fmt.Errorf("%s: want a positive duration, got %q", ParamInterval, v)
		}
	}
	return cfg, interval, nil
}

func ints(list string) ([]int, error) {
	var out []int
	for _, s := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' }) {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

type instance struct {
	cfg      profiler.Config
	interval time.Duration
	rows     *profiledata.Writer
	stats    *profiledata.StatsWriter

	p         *profiler.Profiler
	cancel    context.CancelFunc // stops p.Run
	runDone   chan error
	stopTicks chan struct{}
	ticksDone chan struct{}
}

func (i *instance) Name() string { return Name }

func (i *instance) ExtraParams(operators.GadgetContext) api.Params { return params }

// Start loads the object, attaches, and emits the books every interval.
func (i *instance) Start(gadgetCtx operators.GadgetContext) error {
	p, err := profiler.New(i.cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	i.p, i.cancel = p, cancel
	i.runDone, i.stopTicks, i.ticksDone = make(chan error, 1), make(chan struct{}), make(chan struct{})
	go func() { i.runDone <- p.Run(ctx) }()
	go func() {
		defer close(i.ticksDone)
		tick := time.NewTicker(i.interval)
		defer tick.Stop()
		for {
			select {
			case <-i.stopTicks:
				return
			case <-tick.C:
				if err := i.emit(); err != nil {
					gadgetCtx.Logger().Warnf("gpumem: %v", err)
				}
			}
		}
	}()
	return nil
}

// emit emits the books; the processes that exited before, emitted, are
// dropped.
func (i *instance) emit() error {
	s, err := i.p.Snapshot()
	if err != nil {
		return fmt.Errorf("read loss counters: %w", err)
	}
	defer i.p.DropExited(s)
	if err := i.stats.Emit(s); err != nil {
		return err
	}
	return i.rows.Emit(s)
}

// Stop emits the books once more, with every event read, then detaches.
func (i *instance) Stop(gadgetCtx operators.GadgetContext) error {
	if i.p == nil {
		return nil
	}
	close(i.stopTicks)
	<-i.ticksDone
	syncErr := i.p.Sync()
	emitErr := i.emit()
	i.cancel()
	runErr := <-i.runDone
	return errors.Join(runErr, syncErr, emitErr, i.p.Close())
}

func (i *instance) Close(operators.GadgetContext) error { return nil }
