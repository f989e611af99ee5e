package kubernetes

import (
	"context"
	"testing"
	"time"

	"github.com/inspektor-gadget/inspektor-gadget/pkg/datasource"
	gadgetcontext "github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-context"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-service/api"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/operators"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/operators/simple"

	"github.com/gpu-mem/gpu-mem/operators/k8smeta"
	"github.com/gpu-mem/gpu-mem/operators/pyroscope"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/schema"
)

// TestOperatorsInGadgetContext runs gpu-mem's two IG data operators in IG's
// runtime: a producer emits a profile row of a pod's container; k8smeta
// names it from the API server; pyroscope pushes it with the names.
func TestOperatorsInGadgetContext(t *testing.T) {
	c := startCluster(t)
	pod := trainerPod(t, c)
	receiver, addr := pyroscopetest.Loopback(t)

	ctx, cancel := context.WithTimeout(context.Background(), hangLimit)
	defer cancel()
	var ds datasource.DataSource
	fields := map[string]datasource.FieldAccessor{}
	producer := simple.New("producer",
		simple.WithPriority(k8smeta.Priority-1),
		simple.OnInit(func(gadgetCtx operators.GadgetContext) error {
			var err error
			if ds, err = gadgetCtx.RegisterDataSource(datasource.TypeArray, "gpumem"); err != nil {
				return err
			}
			ds.AddAnnotation(schema.Annotation, "true")
			for name, kind := range map[string]api.Kind{
				schema.PID: api.Kind_Uint32, schema.Comm: api.Kind_String, schema.Kind: api.Kind_String,
				schema.GPU: api.Kind_String, schema.PodUID: api.Kind_String, schema.ContainerID: api.Kind_String,
				schema.Stack: api.Kind_String, schema.AllocBytes: api.Kind_Uint64, schema.AllocCount: api.Kind_Uint64,
				schema.LiveBytes: api.Kind_Uint64, schema.LiveCount: api.Kind_Uint64,
			} {
				if fields[name], err = ds.AddField(name, kind); err != nil {
					return err
				}
			}
			return nil
		}),
		simple.OnStart(func(gadgetCtx operators.GadgetContext) error {
			arr, err := ds.NewPacketArray()
			if err != nil {
				return err
			}
			d := arr.New()
			fields[schema.PID].PutUint32(d, 42)
			for name, v := range map[string]string{schema.Comm: "python3", schema.Kind: "device", schema.GPU: "0",
				schema.PodUID: string(pod.UID), schema.ContainerID: containerID, schema.Stack: "<module>;train;cuMemAlloc_v2"} {
				fields[name].PutString(d, v)
			}
			fields[schema.AllocBytes].PutUint64(d, 4096)
			fields[schema.AllocCount].PutUint64(d, 1)
			fields[schema.LiveBytes].PutUint64(d, 4096)
			fields[schema.LiveCount].PutUint64(d, 1)
			arr.Append(d)
			go func() {
				for len(receiver.Received()) == 0 {
					time.Sleep(20 * time.Millisecond)
				}
				cancel()
			}()
			return ds.EmitAndRelease(arr)
		}),
	)
	gadgetCtx := gadgetcontext.New(ctx, "", gadgetcontext.WithDataOperators(k8smeta.Operator{}, pyroscope.Operator{}, producer))
	if err := gadgetCtx.Run(api.ParamValues{
		"operator.k8smeta." + k8smeta.ParamKubeconfig:   c.kubeconfig,
		"operator.k8smeta." + k8smeta.ParamNodeName:     "node-1",
		"operator.pyroscope." + pyroscope.ParamURL:      "http://" + addr,
		"operator.pyroscope." + pyroscope.ParamInterval: "1s",
	}); err != nil {
		t.Fatal(err)
	}
	pushes := receiver.Received()
	if len(pushes) == 0 {
		t.Fatal("nothing pushed")
	}
	l := pyroscopetest.Labels(pushes[0].Series[0])
	for k, v := range map[string]string{"namespace": "ml", "pod": "trainer-5d9f8-x2x7z", "container": "trainer",
		"service_name": "ml/trainer", "pod_uid": string(pod.UID)} {
		if l[k] != v {
			t.Errorf("label %s=%q, want %q", k, l[k], v)
		}
	}
}
