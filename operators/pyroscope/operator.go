package pyroscope

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/inspektor-gadget/inspektor-gadget/pkg/datasource"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-service/api"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/operators"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/params"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/operators/k8smeta"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/profilerows"
	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// The Inspektor Gadget side: an IG data operator that pushes the data
// sources holding gpu-mem profile rows to Pyroscope, so that the same
// export runs inside any IG build (ig, kubectl gadget, gpumem run).

const (
	// Name is the operator's name; its parameters are operator.pyroscope.*.
	Name = "pyroscope"
	// Priority: after the operators that add metadata to the rows.
	Priority = 9500

	ParamURL          = "pyroscope-url"
	ParamInterval     = "pyroscope-interval"
	ParamQueue        = "pyroscope-queue"
	ParamService      = "service-name"
	ParamNode         = "node"
	ParamCAFile       = "pyroscope-ca-file"
	ParamUser         = "pyroscope-user"
	ParamPasswordFile = "pyroscope-password-file"
	ParamTokenFile    = "pyroscope-token-file"
	ParamTenant       = "pyroscope-tenant"
)

// Operator is the IG data operator.
type Operator struct{}

func (Operator) Name() string              { return Name }
func (Operator) Init(*params.Params) error { return nil }
func (Operator) GlobalParams() api.Params  { return nil }
func (Operator) Priority() int             { return Priority }
func (Operator) InstanceParams() api.Params {
	host, _ := os.Hostname()
	return api.Params{
		{Key: ParamURL, Description: "Pyroscope server, http://HOST:PORT or https://HOST:PORT; empty: off"},
		{Key: ParamInterval, DefaultValue: "15s", TypeHint: api.TypeDuration, Description: "push interval"},
		{Key: ParamQueue, DefaultValue: "20", TypeHint: api.TypeInt, Description: "intervals kept while the server is unreachable"},
		{Key: ParamService, Description: "service_name label (default: the process name)"},
		{Key: ParamNode, DefaultValue: host, Description: "node label"},
		{Key: ParamCAFile, Description: "PEM certificates to trust for an https:// server"},
		{Key: ParamUser, Description: "basic auth user"},
		{Key: ParamPasswordFile, Description: "file holding the basic auth password"},
		{Key: ParamTokenFile, Description: "file holding a bearer token"},
		{Key: ParamTenant, Description: "tenant, sent as X-Scope-OrgID"},
	}
}

// InstantiateDataOperator starts nothing when no URL is set.
func (Operator) InstantiateDataOperator(gadgetCtx operators.GadgetContext, values api.ParamValues) (operators.DataOperatorInstance, error) {
	if values[ParamURL] == "" {
		return nil, nil
	}
	cfg, err := configFrom(values)
	if err != nil {
		return nil, err
	}
	exp, err := New(cfg)
	if err != nil {
		return nil, err
	}
	inst := &instance{exporter: exp, stacks: map[string]accounting.StackID{}}
	for _, ds := range gadgetCtx.GetDataSources() {
		if ds.Annotations()[profilerows.Annotation] != "true" {
			continue
		}
		if err := inst.subscribe(ds); err != nil {
			exp.Close()
			return nil, err
		}
	}
	return inst, nil
}

func configFrom(values api.ParamValues) (Config, error) {
	cfg := Config{
		URL: values[ParamURL], Service: values[ParamService], Node: values[ParamNode],
		CAFile: values[ParamCAFile], User: values[ParamUser], TenantID: values[ParamTenant],
	}
	var err error
	if cfg.Interval, err = time.ParseDuration(values[ParamInterval]); err != nil {
		return cfg, fmt.Errorf("%s: %w", ParamInterval, err)
	}
	if cfg.QueueSize, err = strconv.Atoi(values[ParamQueue]); err != nil {
		return cfg, fmt.Errorf("%s: %w", ParamQueue, err)
	}
	for _, secret := range []struct {
		file string
		dst  *string
	}{{values[ParamPasswordFile], &cfg.Password}, {values[ParamTokenFile], &cfg.Token}} {
		if secret.file == "" {
			continue
		}
		data, err := os.ReadFile(secret.file)
		if err != nil {
			return cfg, fmt.Errorf("read credential: %w", err)
		}
		*secret.dst = strings.TrimRight(string(data), "\r\n")
	}
	return cfg, nil
}

type instance struct {
	exporter *Exporter
	cancel   context.CancelFunc
	done     chan struct{}
	stacks   map[string]accounting.StackID // pid and stack -> a stable ID, for interval deltas
}

func (i *instance) Name() string { return Name }

func (i *instance) subscribe(ds datasource.DataSource) error {
	f := map[string]datasource.FieldAccessor{}
	for _, name := range []string{profilerows.PID, profilerows.Comm, profilerows.Kind, profilerows.GPU, profilerows.PodUID, profilerows.ContainerID,
		profilerows.Stack, profilerows.AllocBytes, profilerows.AllocCount, profilerows.LiveBytes, profilerows.LiveCount} {
		if f[name] = ds.GetField(name); f[name] == nil {
			return fmt.Errorf("data source %s: no field %q", ds.Name(), name)
		}
	}
	// Names, when operators/k8smeta added them.
	for _, name := range []string{profilerows.Namespace, profilerows.Pod, profilerows.Container, profilerows.Workload} {
		if acc := ds.GetField(name); acc != nil {
			f[name] = acc
		}
	}
	return ds.SubscribeArray(func(ds datasource.DataSource, arr datasource.DataArray) error {
		r := profiler.Report{Time: time.Now()}
		for n := range arr.Len() {
			row, err := i.row(f, arr.Get(n))
			if err != nil {
				return fmt.Errorf("data source %s: %w", ds.Name(), err)
			}
			r.Rows = append(r.Rows, row)
		}
		i.exporter.Export(r)
		return nil
	}, Priority)
}

// row reads one profile row; frees are what was allocated and is not live.
func (i *instance) row(f map[string]datasource.FieldAccessor, d datasource.Data) (profiler.Row, error) {
	var row profiler.Row
	var err error
	text := func(name string) string {
		s, e := f[name].String(d)
		err = cmpErr(err, e)
		return s
	}
	number := func(name string) uint64 {
		v, e := f[name].Uint64(d)
		err = cmpErr(err, e)
		return v
	}
	pid, e := f[profilerows.PID].Uint32(d)
	err = cmpErr(err, e)
	kind, ok := tracer.ParseKind(text(profilerows.Kind))
	if !ok {
		err = cmpErr(err, fmt.Errorf("unknown kind"))
	}
	device, convErr := strconv.Atoi(text(profilerows.GPU))
	if convErr != nil {
		device = tracer.DeviceUnknown
	}
	stack := text(profilerows.Stack)
	key := strconv.FormatUint(uint64(pid), 10) + "\x00" + stack
	id, seen := i.stacks[key]
	if !seen {
		id = accounting.StackID(len(i.stacks))
		i.stacks[key] = id
	}
	names := strings.Split(stack, ";")
	for n := len(names) - 1; n >= 0; n-- {
		row.Frames = append(row.Frames, &symbolize.Frame{Function: names[n]})
	}
	row.Key = accounting.Key{PID: pid, Stack: id, Kind: kind, Device: int32(device)}
	row.Comm = text(profilerows.Comm)
	row.Container = k8smeta.Container{PodUID: text(profilerows.PodUID), ContainerID: text(profilerows.ContainerID)}
	if f[profilerows.Namespace] != nil {
		row.Container.Namespace, row.Container.Pod = text(profilerows.Namespace), text(profilerows.Pod)
		row.Container.Name, row.Container.Workload = text(profilerows.Container), text(profilerows.Workload)
	}
	row.AllocBytes, row.AllocCount = number(profilerows.AllocBytes), number(profilerows.AllocCount)
	row.FreeBytes = row.AllocBytes - number(profilerows.LiveBytes)
	row.FreeCount = row.AllocCount - number(profilerows.LiveCount)
	return row, err
}

func cmpErr(first, next error) error {
	if first != nil {
		return first
	}
	return next
}

func (i *instance) Start(gadgetCtx operators.GadgetContext) error {
	ctx, cancel := context.WithCancel(context.Background())
	i.cancel, i.done = cancel, make(chan struct{})
	go func() { i.exporter.Run(ctx); close(i.done) }()
	return nil
}

// Stop lets the queued intervals go out for a moment, then stops sending.
func (i *instance) Stop(gadgetCtx operators.GadgetContext) error {
	deadline := time.Now().Add(5 * time.Second)
	for i.exporter.Stats().Queued > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	i.cancel()
	<-i.done
	return nil
}

func (i *instance) Close(gadgetCtx operators.GadgetContext) error {
	return i.exporter.Close()
}

func init() {
	operators.RegisterDataOperator(Operator{})
}
