// Package pyroscope is the Pyroscope exporter (package pyroscope at the
// root) as an Inspektor Gadget data operator: it pushes the data sources
// holding gpu-mem profile rows, so that the same export runs inside any IG
// build (ig, kubectl gadget, gpumem run). The lean agent uses the exporter
// directly and links none of this.
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

	"github.com/gpu-mem/gpu-mem/profiledata"
	exporter "github.com/gpu-mem/gpu-mem/pyroscope"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

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
	exp, err := exporter.New(cfg)
	if err != nil {
		return nil, err
	}
	inst := &instance{exporter: exp}
	for _, ds := range gadgetCtx.GetDataSources() {
		if ds.Annotations()[schema.Annotation] != "true" {
			continue
		}
		if err := inst.subscribe(ds); err != nil {
			exp.Close()
			return nil, err
		}
	}
	return inst, nil
}

func configFrom(values api.ParamValues) (exporter.Config, error) {
	cfg := exporter.Config{
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
	exporter *exporter.Exporter
	cancel   context.CancelFunc
	done     chan struct{}
}

func (i *instance) Name() string { return Name }

func (i *instance) subscribe(ds datasource.DataSource) error {
	return profiledata.SubscribeSnapshots(ds, Priority, func(r *snapshot.Snapshot) error {
		i.exporter.Export(r)
		return nil
	})
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
