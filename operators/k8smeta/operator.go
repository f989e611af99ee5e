// Package k8smeta is the pod watch (package kube) as an Inspektor Gadget
// data operator: it adds the names of pods to gpu-mem profile rows
// (schema), from their pod UID and container ID. The lean agent uses the
// watch directly and links none of this.
package k8smeta

import (
	"fmt"
	"os"

	"github.com/inspektor-gadget/inspektor-gadget/pkg/datasource"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-service/api"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/operators"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/params"

	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/kube"
	"github.com/gpu-mem/gpu-mem/schema"
)

const (
	// Name is the operator's name; its parameters are operator.k8smeta.*.
	Name = "k8smeta"
	// Priority: before the exporters (operators/pyroscope is 9500).
	Priority = 9000

	ParamKubeconfig = "kubeconfig"
	ParamNodeName   = "node-name"
)

// Operator is the IG data operator.
type Operator struct{}

func (Operator) Name() string              { return Name }
func (Operator) Init(*params.Params) error { return nil }
func (Operator) GlobalParams() api.Params  { return nil }
func (Operator) Priority() int             { return Priority }
func (Operator) InstanceParams() api.Params {
	host, _ := os.Hostname()
	node := os.Getenv("NODE_NAME")
	if node == "" {
		node = host
	}
	return api.Params{
		{Key: ParamKubeconfig, Description: "API server to name pods from (default: the in-cluster one)"},
		{Key: ParamNodeName, DefaultValue: node, Description: "the node whose pods are watched"},
	}
}

// InstantiateDataOperator starts nothing without an API server.
func (Operator) InstantiateDataOperator(gadgetCtx operators.GadgetContext, values api.ParamValues) (operators.DataOperatorInstance, error) {
	cfg, err := kube.Config(values[ParamKubeconfig])
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	if cfg == nil {
		return nil, nil
	}
	pods, err := kube.WatchPods(gadgetCtx.Context(), cfg, values[ParamNodeName])
	if err != nil {
		return nil, err
	}
	for _, ds := range gadgetCtx.GetDataSources() {
		if ds.Annotations()[schema.Annotation] != "true" {
			continue
		}
		if err := name(ds, pods); err != nil {
			return nil, err
		}
	}
	return instance{}, nil
}

// name adds the name fields to a profile data source and fills them.
func name(ds datasource.DataSource, pods *kube.Pods) error {
	uid, id := ds.GetField(schema.PodUID), ds.GetField(schema.ContainerID)
	if uid == nil || id == nil {
		return fmt.Errorf("data source %s: no %s or %s field", ds.Name(), schema.PodUID, schema.ContainerID)
	}
	added := map[string]datasource.FieldAccessor{}
	for _, field := range []string{schema.Namespace, schema.Pod, schema.Container, schema.Workload} {
		acc, err := ds.AddField(field, api.Kind_String)
		if err != nil {
			return fmt.Errorf("data source %s: add %s: %w", ds.Name(), field, err)
		}
		added[field] = acc
	}
	return ds.Subscribe(func(ds datasource.DataSource, d datasource.Data) error {
		var c container.Identity
		var err error
		if c.PodUID, err = uid.String(d); err != nil {
			return err
		}
		if c.ContainerID, err = id.String(d); err != nil {
			return err
		}
		c = pods.Name(c)
		for field, value := range map[string]string{schema.Namespace: c.Namespace, schema.Pod: c.Pod,
			schema.Container: c.Name, schema.Workload: c.Workload} {
			if err := added[field].PutString(d, value); err != nil {
				return err
			}
		}
		return nil
	}, Priority)
}

type instance struct{}

func (instance) Name() string                        { return Name }
func (instance) Start(operators.GadgetContext) error { return nil }
func (instance) Stop(operators.GadgetContext) error  { return nil }
func (instance) Close(operators.GadgetContext) error { return nil }

func init() {
	operators.RegisterDataOperator(Operator{})
}
