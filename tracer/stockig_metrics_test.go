package tracer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/datasource"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/datasource/compat"
	gadgetcontext "github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-context"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-service/api"
	apihelpers "github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-service/api-helpers"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/gadgets/run/types"
	metadatav1 "github.com/inspektor-gadget/inspektor-gadget/pkg/metadata/v1"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/operators"
	otelmetrics "github.com/inspektor-gadget/inspektor-gadget/pkg/operators/otel-metrics"
	"github.com/inspektor-gadget/inspektor-gadget/pkg/operators/simple"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
)

// The data source of top_cuda_memory's counters and what the test's pod is.
const (
	memStats     = "libcuda_mem_stats"
	podNamespace = "ml"
	podName      = "trainer-0"
	podContainer = "trainer"
)

// TestStockIGDashboardMetrics runs simwork's kinds scenario under the
// object loaded and attached as stock IG does, reads class_stats as IG's map
// iterator does (look up and delete, once while the process runs and once
// after its exit), and hands what it read to IG's own otel-metrics operator,
// in IG's runtime, on a data source configured by gadget.yaml through IG's
// metadata parser, with the pod fields IG's Kubernetes enrichment adds. The
// operator's Prometheus endpoint must then serve the names and labels IG's
// GPU observability dashboard queries, and exact bytes.
func TestStockIGDashboardMetrics(t *testing.T) {
	spec, coll, lib := loadStockIG(t)
	attachPerFunction(t, spec, coll, lib)
	fields := derivedFields(t, spec)
	if want := []string{"comm", "host_raw", "mem_alloc_bytes", "mem_free_bytes", "mem_implicit_free_bytes", "mntns_id", "pid"}; !slices.Equal(fields, want) {
		t.Fatalf("IG derives the fields %v of %s from the object, the test feeds %v", fields, memStats, want)
	}
	classNames := enumNames(t, spec, "gpumem_mem_class")

	pid, reads := runKindsReading(t, coll, lib)

	addr := freeAddress(t)
	globals := apihelpers.ToParamDescs(otelmetrics.Operator.GlobalParams()).ToParams()
	for k, v := range map[string]string{otelmetrics.ParamOtelMetricsListen: "true", otelmetrics.ParamOtelMetricsListenAddress: addr} {
		if err := globals.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := otelmetrics.Operator.Init(globals); err != nil {
		t.Fatal(err)
	}
	metadata, err := os.ReadFile("../gadget.yaml")
	if err != nil {
		t.Fatal(err)
	}
	feed := &mapIterFeed{reads: reads, classNames: classNames}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // bounds a hang only
	defer cancel()
	producer := simple.New("mapiter",
		simple.WithPriority(otelmetrics.Priority-1),
		simple.OnInit(func(gadgetCtx operators.GadgetContext) error {
			if err := gadgetCtx.SetMetadata(metadata); err != nil {
				return err
			}
			return feed.register(gadgetCtx)
		}),
		simple.OnStart(func(operators.GadgetContext) error {
			defer cancel()
			return feed.emit()
		}),
	)
	gadgetCtx := gadgetcontext.New(ctx, "", gadgetcontext.WithDataOperators(otelmetrics.Operator, producer))
	if err := gadgetCtx.Run(api.ParamValues{
		"operator.otel-metrics." + otelmetrics.ParamOtelMetricsName: memStats + ":" + memStats,
	}); err != nil {
		t.Fatal(err)
	}

	got := scrape(t, addr)
	const MiB = 1 << 20
	// The kinds scenario (checkKinds): on the GPU, 3 x 1 MiB, a 1024 x 30
	// pitched one, 2 MiB managed, 311296 asynchronous, 2 + 4 MiB of VMM
	// and the 12345 made before it starts; in host memory 4096 + 8192
	// pinned. Freed: 1 MiB, 114688 asynchronous, 2 MiB of VMM and the
	// 12345; 8192 pinned. The rest went with its exit.
	device := map[string]float64{
		"mem_alloc_bytes_total":         11*MiB + 30720 + 311296 + 12345,
		"mem_free_bytes_total":          3*MiB + 114688 + 12345,
		"mem_implicit_free_bytes_total": 8*MiB + 227328,
	}
	host := map[string]float64{
		"mem_alloc_bytes_total":         12288,
		"mem_free_bytes_total":          8192,
		"mem_implicit_free_bytes_total": 4096,
	}
	for name, byClass := range map[string]map[string]float64{"0": device, "1": host} {
		labels := map[string]string{
			"pid": fmt.Sprint(pid), "comm": "simwork", "host_raw": name, "host": classNames[map[string]uint64{"0": 0, "1": 1}[name]],
			"k8s_namespace": podNamespace, "k8s_podname": podName, "k8s_containername": podContainer,
		}
		for metric, want := range byClass {
			if v, err := value(got, metric, labels); err != nil || v != want {
				t.Errorf("%s%v = %v (%v), want %v", metric, labels, v, err, want)
			}
		}
	}
	if classNames[0] != "CUDA_MEM_DEVICE" || classNames[1] != "CUDA_MEM_HOST" {
		t.Errorf("memory classes %v, want top_cuda_memory's CUDA_MEM_DEVICE and CUDA_MEM_HOST, as the agent labels them", classNames)
	}
}

// TestStockIGIteratorEmptiesProcesses shows what docs/inspektor-gadget.md
// says IG's map iterator does to the processes map: a read between an
// allocation and its free deletes the process's entry, and the free is then
// taken from totals that never counted the allocation. The kinds scenario's
// first allocation (12345 bytes, made before it waits) is read away, then
// freed with the others: allocated bytes miss it, and live bytes are short
// of it.
func TestStockIGIteratorEmptiesProcesses(t *testing.T) {
	spec, coll, lib := loadStockIG(t)
	attachPerFunction(t, spec, coll, lib)
	w, stdin := startKinds(t, lib)
	defer w.Process.Kill()
	pid := uint32(w.Process.Pid)
	keys, _ := readAndDelete[gpumemGpumemProcessKey, gpumemGpumemProcess](t, coll.Maps["processes"])
	if !slices.Contains(keys, gpumemGpumemProcessKey{Pid: pid}) {
		t.Fatalf("the process's first allocation is not in processes (%v)", keys)
	}
	stdin.run()
	var proc gpumemGpumemProcess
	if err := coll.Maps["processes"].Lookup(gpumemGpumemProcessKey{Pid: pid}, &proc); err != nil {
		t.Fatal(err)
	}
	const MiB = 1 << 20
	allocated := uint64(11*MiB + 354304) // all but the first (checkKinds)
	live := allocated - (3*MiB + 122880) // what the process holds
	if proc.AllocBytes != allocated || proc.LiveBytes != live-12345 {
		t.Errorf("after IG's read: %d allocated, %d live; want %d and %d: the first allocation read away, its free not",
			proc.AllocBytes, proc.LiveBytes, allocated, live-12345)
	}
	stdin.stdin.Close()
	w.Wait()
}

// runKindsReading runs the kinds scenario and reads class_stats as IG's
// iterator does: once when the scenario is done, once after the exit.
func runKindsReading(t *testing.T, coll *ebpf.Collection, lib string) (uint32, [][]classRead) {
	w, stdin := startKinds(t, lib)
	defer w.Process.Kill()
	pid := uint32(w.Process.Pid)
	stdin.run()
	running := classReads(t, coll.Maps["class_stats"], pid)
	stdin.stdin.Close()
	if err := w.Wait(); err != nil {
		t.Fatal(err)
	}
	exited := classReads(t, coll.Maps["class_stats"], pid)
	var (
		key  gpumemGpumemClassKey
		live gpumemGpumemClassLive
	)
	for it := coll.Maps["class_live"].Iterate(); it.Next(&key, &live); {
		if key.Pid == pid {
			t.Errorf("exited process still holds %+v in class_live", live)
		}
	}
	if len(running) != 2 || len(exited) != 2 {
		t.Fatalf("read %d classes while running, %d after the exit; want 2 and 2", len(running), len(exited))
	}
	for _, r := range running {
		if r.stats.MemImplicitFreeBytes != 0 {
			t.Errorf("implicit frees before the exit: %+v", r)
		}
	}
	for _, r := range exited {
		if r.stats.MemAllocBytes != 0 || r.stats.MemFreeBytes != 0 {
			t.Errorf("after the first read, only the exit's implicit frees are new: %+v", r)
		}
	}
	return pid, [][]classRead{running, exited}
}

type classRead struct {
	key   gpumemGpumemClassKey
	stats gpumemGpumemClassStats
}

// readAndDelete reads and empties a map with BPF_MAP_LOOKUP_AND_DELETE_BATCH,
// IG's map iterator's call.
func readAndDelete[K, V any](t *testing.T, m *ebpf.Map) ([]K, []V) {
	t.Helper()
	keys := make([]K, m.MaxEntries())
	values := make([]V, m.MaxEntries())
	var cursor ebpf.MapBatchCursor
	n, err := m.BatchLookupAndDelete(&cursor, keys, values, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("read %s: %v", m, err)
	}
	return keys[:n], values[:n]
}

// classReads reads class_stats as IG does, keeping process pid's entries.
func classReads(t *testing.T, m *ebpf.Map, pid uint32) []classRead {
	t.Helper()
	keys, values := readAndDelete[gpumemGpumemClassKey, gpumemGpumemClassStats](t, m)
	var reads []classRead
	for i, k := range keys {
		if k.Pid == pid {
			reads = append(reads, classRead{k, values[i]})
		}
	}
	return reads
}

// mapIterFeed is the data source IG's eBPF operator makes of class_stats,
// with what IG's formatters and Kubernetes enrichment add to it.
type mapIterFeed struct {
	reads      [][]classRead
	classNames map[uint64]string
	ds         datasource.DataSource
	f          map[string]datasource.FieldAccessor
}

func (m *mapIterFeed) register(gadgetCtx operators.GadgetContext) error {
	ds, err := gadgetCtx.RegisterDataSource(datasource.TypeArray, memStats)
	if err != nil {
		return err
	}
	m.ds, m.f = ds, map[string]datasource.FieldAccessor{}
	for _, f := range []struct {
		name string
		kind api.Kind
	}{{"pid", api.Kind_Uint32}, {"host_raw", api.Kind_Uint8}, {"comm", api.Kind_CString}, {"mntns_id", api.Kind_Uint64},
		{"mem_alloc_bytes", api.Kind_Uint64}, {"mem_free_bytes", api.Kind_Uint64}, {"mem_implicit_free_bytes", api.Kind_Uint64},
		{"host", api.Kind_String}} {
		if m.f[f.name], err = ds.AddField(f.name, f.kind); err != nil {
			return err
		}
	}
	// The k8s.* fields as IG's Kubernetes enrichment adds them.
	if _, err := compat.WrapAccessors(ds, m.f["mntns_id"], nil); err != nil {
		return err
	}
	for _, name := range []string{"k8s.namespace", "k8s.podName", "k8s.containerName"} {
		if m.f[name] = ds.GetField(name); m.f[name] == nil {
			return fmt.Errorf("enrichment added no %s", name)
		}
	}
	return nil
}

// emit sends each read as one array, as IG's iterator does every interval.
func (m *mapIterFeed) emit() error {
	for _, read := range m.reads {
		arr, err := m.ds.NewPacketArray()
		if err != nil {
			return err
		}
		for _, r := range read {
			d := arr.New()
			m.f["pid"].PutUint32(d, r.key.Pid)
			m.f["host_raw"].PutUint8(d, r.key.HostRaw)
			m.f["host"].PutString(d, m.classNames[uint64(r.key.HostRaw)])
			m.f["comm"].PutString(d, cString(r.stats.Comm[:]))
			m.f["mntns_id"].PutUint64(d, r.stats.MntnsId)
			m.f["mem_alloc_bytes"].PutUint64(d, r.stats.MemAllocBytes)
			m.f["mem_free_bytes"].PutUint64(d, r.stats.MemFreeBytes)
			m.f["mem_implicit_free_bytes"].PutUint64(d, r.stats.MemImplicitFreeBytes)
			m.f["k8s.namespace"].PutString(d, podNamespace)
			m.f["k8s.podName"].PutString(d, podName)
			m.f["k8s.containerName"].PutString(d, podContainer)
			arr.Append(d)
		}
		if err := m.ds.EmitAndRelease(arr); err != nil {
			return err
		}
	}
	return nil
}

func cString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// derivedFields are the top-level fields IG derives from the object for
// the counters' data source, less those named __*, which IG's eBPF operator
// leaves out of the data source.
func derivedFields(t *testing.T, spec *ebpf.CollectionSpec) []string {
	t.Helper()
	derived := &metadatav1.GadgetMetadata{}
	if err := types.Populate(derived, spec); err != nil {
		t.Fatal(err)
	}
	ds, ok := derived.DataSources[memStats]
	if !ok {
		t.Fatalf("no data source %s in the object", memStats)
	}
	var names []string
	for name := range ds.Fields {
		if !strings.Contains(name, ".") && !strings.HasPrefix(name, "__") {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// enumNames are an enum's names by value, as IG's enum formatter shows them.
func enumNames(t *testing.T, spec *ebpf.CollectionSpec, name string) map[uint64]string {
	t.Helper()
	var e *btf.Enum
	if err := spec.Types.TypeByName(name, &e); err != nil {
		t.Fatal(err)
	}
	names := map[uint64]string{}
	for _, v := range e.Values {
		names[v.Value] = v.Name
	}
	return names
}

func freeAddress(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// scrape reads the operator's Prometheus endpoint, waiting for its listener.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	var body []byte
	waitfor.Value(t, "answer at "+addr, 10*time.Second, func() error {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		_, err = buf.ReadFrom(resp.Body)
		body = buf.Bytes()
		return err
	}, func(err error) bool { return err == nil })
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse %s: %v", body, err)
	}
	return families
}

// value is the sample of metric whose labels include labels, the only one.
func value(families map[string]*dto.MetricFamily, metric string, labels map[string]string) (float64, error) {
	f, ok := families[metric]
	if !ok {
		return 0, fmt.Errorf("no metric %s", metric)
	}
	var found []float64
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range labels {
			match = match && have[k] == v
		}
		if match && m.Counter != nil {
			found = append(found, m.Counter.GetValue())
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("%d samples match", len(found))
	}
	return found[0], nil
}
