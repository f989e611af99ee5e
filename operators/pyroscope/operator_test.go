package pyroscope

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/datasource"
	gadgetcontext "github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-context"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-service/api"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/operators"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/operators/simple"

	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/schema"
)

type profileRow struct {
	pid                                          uint32
	comm, kind, gpu, pod, container, stack       string
	allocBytes, allocCount, liveBytes, liveCount uint64
}

// TestOperatorInGadgetContext runs the operator in Inspektor Gadget's own
// runtime: a producer operator registers a data source of profile rows and
// emits two intervals; the operator pushes them to a real PusherService.
func TestOperatorInGadgetContext(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &pyroscopetest.Receiver{}
	pyroscopetest.Serve(t, r, lis)

	intervals := [][]profileRow{
		{{10, "train", "device", "0", "pod-uid", "ctr-id", "<module>;load_weights;cuMemAlloc_v2", 300, 3, 300, 3}},
		{{10, "train", "device", "0", "pod-uid", "ctr-id", "<module>;load_weights;cuMemAlloc_v2", 500, 5, 200, 2}},
	}
	var ds datasource.DataSource
	fields := map[string]datasource.FieldAccessor{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	producer := simple.New("producer",
		simple.WithPriority(Priority-1),
		simple.OnInit(func(gadgetCtx operators.GadgetContext) error {
			var err error
			if ds, err = gadgetCtx.RegisterDataSource(datasource.TypeArray, "gpumem"); err != nil {
				return err
			}
			ds.AddAnnotation(schema.Annotation, "true")
			kinds := map[string]api.Kind{schema.PID: api.Kind_Uint32, schema.AllocBytes: api.Kind_Uint64, schema.AllocCount: api.Kind_Uint64,
				schema.LiveBytes: api.Kind_Uint64, schema.LiveCount: api.Kind_Uint64}
			for _, name := range []string{schema.PID, schema.Comm, schema.Kind, schema.GPU, schema.PodUID, schema.ContainerID,
				schema.Stack, schema.AllocBytes, schema.AllocCount, schema.LiveBytes, schema.LiveCount} {
				kind, ok := kinds[name]
				if !ok {
					kind = api.Kind_String
				}
				if fields[name], err = ds.AddField(name, kind); err != nil {
					return err
				}
			}
			return nil
		}),
		simple.OnStart(func(gadgetCtx operators.GadgetContext) error {
			for _, rows := range intervals {
				arr, err := ds.NewPacketArray()
				if err != nil {
					return err
				}
				for _, row := range rows {
					d := arr.New()
					fields[schema.PID].PutUint32(d, row.pid)
					for name, v := range map[string]string{schema.Comm: row.comm, schema.Kind: row.kind, schema.GPU: row.gpu,
						schema.PodUID: row.pod, schema.ContainerID: row.container, schema.Stack: row.stack} {
						fields[name].PutString(d, v)
					}
					for name, v := range map[string]uint64{schema.AllocBytes: row.allocBytes, schema.AllocCount: row.allocCount,
						schema.LiveBytes: row.liveBytes, schema.LiveCount: row.liveCount} {
						fields[name].PutUint64(d, v)
					}
					arr.Append(d)
				}
				if err := ds.EmitAndRelease(arr); err != nil {
					return err
				}
			}
			go func() {
				for len(r.Received()) < len(intervals) {
					time.Sleep(20 * time.Millisecond)
				}
				cancel()
			}()
			return nil
		}),
	)
	gadgetCtx := gadgetcontext.New(ctx, "", gadgetcontext.WithDataOperators(Operator{}, producer))
	err = gadgetCtx.Run(api.ParamValues{
		"operator.pyroscope." + ParamURL:      "http://" + lis.Addr().String(),
		"operator.pyroscope." + ParamInterval: "1s",
		"operator.pyroscope." + ParamNode:     "node-3",
	})
	if err != nil {
		t.Fatal(err)
	}
	pushes := r.Received()
	if len(pushes) != 2 {
		t.Fatalf("%d pushes, want 2", len(pushes))
	}
	series := pushes[1].Series[0]
	labels := pyroscopetest.Labels(series)
	for k, v := range map[string]string{"service_name": "train", "pid": "10", "kind": "device", "gpu": "0",
		"pod_uid": "pod-uid", "container_id": "ctr-id", "node": "node-3", "__delta__": "false"} {
		if labels[k] != v {
			t.Errorf("label %s=%q, want %q", k, labels[k], v)
		}
	}
	p, err := profile.ParseData(series.Samples[0].RawProfile)
	if err != nil {
		t.Fatal(err)
	}
	s := p.Sample[0]
	// The second interval allocated 200 bytes in 2 calls; 200 are live.
	if s.Value[0] != 2 || s.Value[1] != 200 || s.Value[2] != 2 || s.Value[3] != 200 {
		t.Errorf("values %v", s.Value)
	}
	if fn := s.Location[0].Line[0].Function.Name; fn != "cuMemAlloc_v2" || s.Location[2].Line[0].Function.Name != "<module>" {
		t.Errorf("stack %v", s.Location)
	}
}
