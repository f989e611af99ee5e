// Package dashboards builds gpu-mem's Grafana dashboard with the Grafana
// Foundation SDK's typed builders: flame graphs of what the agent pushes to
// Pyroscope and time series of the metrics it serves to Prometheus, every
// profile type, metric and label named by the package that defines it
// (pprof, operators/pyroscope, metrics), never copied.
//
// The JSON is generated, not edited: `go generate ./dashboards/...` writes
// it to each of Outputs (TestOutputsAreGenerated fails on a hand edit).
// The agent does not import this package.
package dashboards

//go:generate go run ./gen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/grafanapyroscope"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
	"github.com/grafana/grafana-foundation-sdk/go/units"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/metrics"
	"github.com/gpu-mem/gpu-mem/pprof"
	"github.com/gpu-mem/gpu-mem/pyroscope"
	"github.com/gpu-mem/gpu-mem/schema"
)

// Outputs are where the generator writes the dashboard, relative to the
// repository's root: beside the code, and inside the chart, which ships it
// as a ConfigMap (Helm reads files from the chart's own folder only).
var Outputs = []string{"dashboards/gpu-mem.json", "charts/gpu-mem/dashboards/gpu-mem.json"}

// The dashboard's identity. Version goes up with each change of what the
// dashboard shows, so that Grafana's history tells versions apart.
const (
	uid     = "gpu-mem"
	title   = "gpu-mem: GPU memory by code and pod"
	version = 6
)

// Data source plugins (the SDK names none).
const (
	pyroscopePlugin  = "grafana-pyroscope-datasource"
	prometheusPlugin = "prometheus"
)

// Variables: the data sources, picked on import, and the label values
// every panel filters by.
const (
	varPyroscope  = "pyroscope"
	varPrometheus = "prometheus"
	varNamespace  = "namespace"
	varPod        = "pod"
	varService    = "service"
)

// Panel sizes on Grafana's 24-column grid: flame graphs two to a row, the
// Prometheus panels four (per pod) or two (per process and GPU) to a row.
const (
	flameHeight, flameWidth   = 14, 12
	seriesHeight, seriesWidth = 8, 6
	peakWidth                 = 12
)

// neverAdd ends the description of every panel of one view.
const neverAdd = "The driver view and the tensor view are two accounts of the same memory " +
	"(a tensor lies inside a segment of PyTorch's caching allocator): never add them."

// A flame graph of held bytes or of peaks is a reading at a moment: each
// interval's profile is the state at its end (or its peak), and over a
// range Pyroscope sums them (its merge has no other aggregation, v1.15 and
// v2.2 alike), which would read N times what is held. Those panels read
// the last whole interval: a window of the agent's default interval,
// shifted back so that the interval ending now, still on its way to
// Pyroscope, is not half in it. Grafana applies a panel's window to
// relative ranges only ("Last 1 hour"): with an absolute range (a zoom
// into the past) it reads the whole range again, said in the description.
var (
	lastInterval      = pyroscope.DefaultInterval.String()
	lastIntervalShift = "2s"
	// atAMoment says how a flame graph of held bytes or peaks reads.
	atAMoment = "It reads the agent's last interval (" + lastInterval + ", --pyroscope-interval: with another, set " +
		"the panel's relative time, shown in its header, to it). Zoomed to an absolute range, Grafana drops the " +
		"panel's window and the graph sums every interval's profile in the range: divide by the intervals in it."
)

// flameGraph is one flame graph panel: a sample type of one view.
type flameGraph struct {
	id          uint32
	title       string
	description string
	view        memory.View
	sampleType  int // where in pprof.SampleTypes(view); growthSpace: pprof.GrowthSampleType(view)
}

// growthSpace is a flameGraph's sampleType for the view's growth profile.
const growthSpace = -1

// atAMoment says whether the panel's profiles are states (held bytes,
// peaks, growth), read over the last interval, rather than amounts over
// the range.
func (f flameGraph) atAMoment() bool { return f.sampleType != pprof.AllocSpace }

// profileTypeID is the Pyroscope profile type the panel reads.
func (f flameGraph) profileTypeID() string {
	if f.sampleType == growthSpace {
		return pyroscope.ProfileTypeID(pprof.GrowthSampleType(f.view))
	}
	return profileTypeID(f.view, f.sampleType)
}

// flameGraphs are the Pyroscope panels, row by row: live bytes, allocated
// bytes and each interval's peak, the driver view left, the tensor view
// right. The IDs are those the hand-written dashboard had, so that links to
// a panel (viewPanel=ID) keep working.
var flameGraphs = []flameGraph{
	{1, "GPU memory held now by function (driver view)",
		"What the GPUs hold: memory from the CUDA driver that each function holds at the end of the last interval, " +
			"the CUDA context and modules included (pinned host memory, gpu=\"host\", left out). Under PyTorch's " +
			"caching allocator, its segments, under the code whose tensor made it grow. Wide bars at the top are " +
			"where memory is allocated. " + atAMoment + " " + neverAdd,
		memory.ViewDriver, pprof.InuseSpace},
	{2, "Live tensors now by function (tensor view)",
		"What PyTorch's tensors hold at the end of the last interval, by the code that made them (the caching " +
			"allocator's probes). The difference to the driver view is the allocator's cache. " + atAMoment + " " + neverAdd,
		memory.ViewTensor, pprof.InuseSpace},
	{3, "GPU memory allocated by function over the range (driver view)",
		"Bytes allocated from the CUDA driver on the GPUs during the time range, by the code that allocated them " +
			"(pinned host memory left out). " + neverAdd,
		memory.ViewDriver, pprof.AllocSpace},
	{4, "Tensors allocated by function over the range (tensor view)",
		"Bytes of PyTorch tensors allocated during the time range, by the code that made them. " + neverAdd,
		memory.ViewTensor, pprof.AllocSpace},
	{9, "GPU memory at the last interval's peak, by function (driver view)",
		"What held the GPU's memory at its worst moment: the most each process held at once on a GPU during " +
			"the last interval, however briefly, the CUDA context and modules included, and each function's share of " +
			"it (a spike of activations freed before the interval's end is here, not in the held bytes). Peaks of two " +
			"processes or GPUs came at different moments: filter by pod, pid and gpu for one. " + atAMoment + " " + neverAdd,
		memory.ViewDriver, pprof.PeakSpace},
	{10, "Tensors at the last interval's peak, by function (tensor view)",
		"What PyTorch's tensors held at each process's peak of tensors on a GPU during the last interval, by the " +
			"code that made them. " + atAMoment + " " + neverAdd,
		memory.ViewTensor, pprof.PeakSpace},
	{14, "Growing GPU memory by function (driver view)",
		"What grows: for each stack whose low-water mark (the least it held in an interval) rose in each of the last " +
			"intervals (the agent's --growth-intervals), how much it rose over them, by the code that keeps the memory: a leak, " +
			"or a cache still filling. Empty while nothing grows (docs/leaks.md). " + atAMoment + " " + neverAdd,
		memory.ViewDriver, growthSpace},
	{15, "Growing tensors by function (tensor view)",
		"What grows among PyTorch's tensors, by the Python line that keeps them: each growing stack's rise over the " +
			"last intervals (docs/leaks.md). " + atAMoment + " " + neverAdd,
		memory.ViewTensor, growthSpace},
}

// series is one Prometheus time series panel.
type series struct {
	id          uint32
	title       string
	description string
	width       uint32
	unit        string
	expr        string
	legend      string
	// perPod repeats the panel for each pod picked, its series stacked:
	// the parts of one pod's whole.
	perPod bool
}

var (
	driverMetrics = metrics.ViewNames(memory.ViewDriver)
	tensorMetrics = metrics.ViewNames(memory.ViewTensor)
	// perPod and perGPU are how panels sum series, and their legends.
	perPod       = []string{schema.Namespace, schema.Pod}
	perGPU       = []string{schema.Namespace, schema.Pod, schema.PID, schema.GPU}
	perPodLegend = legend(schema.Namespace) + "/" + legend(schema.Pod)
	perGPULegend = perPodLegend + " pid " + legend(schema.PID) + " gpu " + legend(schema.GPU)
)

// seriesPanels are the Prometheus panels, row by row: per pod, live bytes
// of each view, the allocation rate and out-of-memory failures; then each
// process's peak per GPU in each view (a peak is never summed: peaks of two
// processes came at different moments).
var seriesPanels = []series{
	{5, "GPU memory held per pod (driver view)",
		"Bytes the GPUs hold for each pod's processes: allocated through the CUDA driver and not yet freed, and, " +
			"with NVML, their CUDA contexts and modules (pinned host memory, gpu=\"host\", left out).",
		seriesWidth, units.BytesIEC, sumBy(perPod, selector(driverMetrics.LiveBytes, onGPUs)), perPodLegend, false},
	{6, "Live tensors per pod (tensor view)",
		"Bytes of PyTorch tensors not yet freed, inside the driver view's segments: not to be added to it.",
		seriesWidth, units.BytesIEC, sumBy(perPod, selector(tensorMetrics.LiveBytes)), perPodLegend, false},
	{7, "Allocation rate per pod (driver view)",
		"Bytes per second allocated through the CUDA driver on the GPUs (pinned host memory left out).",
		seriesWidth, units.BytesPerSecondSI, sumBy(perPod, "rate("+selector(driverMetrics.AllocatedBytes, onGPUs)+"[5m])"), perPodLegend, false},
	{8, "Out-of-memory failures per pod",
		"Allocations the driver refused with CUDA_ERROR_OUT_OF_MEMORY in the last 5 minutes (a process's first " +
			"counts too: its series start at 0 when the agent sees its CUDA context).",
		seriesWidth, units.Short,
		sumBy(perPod, "increase("+selector(metrics.FailuresName, equal(metrics.LabelCode, strconv.Itoa(memory.CUDAOutOfMemory)))+"[5m])"),
		perPodLegend, false},
	{11, "Peak GPU memory per process and GPU (driver view)",
		"The most bytes each process held at once on each GPU during the agent's last interval, however briefly, " +
			"its CUDA context and modules included: what an out-of-memory error meets, never below what it holds. " +
			"One line per process and GPU: peaks of two came at different moments.",
		peakWidth, units.BytesIEC, maxBy(perGPU, selector(driverMetrics.PeakBytes, onGPUs)), perGPULegend, false},
	{12, "Peak of tensors per process and GPU (tensor view)",
		"The most bytes each process's PyTorch tensors held at once on each GPU during the agent's last interval, " +
			"inside the driver view's segments: not to be added to it.",
		peakWidth, units.BytesIEC, maxBy(perGPU, selector(tensorMetrics.PeakBytes)), perGPULegend, false},
	{13, "Where the GPU memory went: ${pod}",
		"The pod's processes' memory on the GPUs by category (gpu-mem's breakdown: parameters, gradients, optimizer " +
			"state, KV cache, activations, CUDA graph pools, the allocator's cache, libraries' workspaces, contexts, " +
			"driver internals), stacked: the parts sum to what nvidia-smi says the processes use. The tensor categories " +
			"need the tensor view; without it, PyTorch's segments are one part, allocator_segments.",
		peakWidth, units.BytesIEC, sumBy([]string{schema.Namespace, schema.Pod, metrics.LabelCategory, metrics.LabelLibrary},
			selector(metrics.BreakdownName)), legend(metrics.LabelCategory) + " " + legend(metrics.LabelLibrary), true},
	{16, "Growing GPU memory per process and GPU",
		"How fast each process's memory grows on each GPU, per view: the sum over its stacks whose low-water mark rose in " +
			"each of the last intervals, named by the fastest's function (docs/leaks.md). Nothing while nothing grows.",
		peakWidth, units.BytesPerSecondIEC, maxBy(append(slices.Clone(perGPU), metrics.LabelView, metrics.LabelFunction),
			selector(metrics.GrowingBytesPerSecondName)), perGPULegend + " " + legend(metrics.LabelView) + ": " + legend(metrics.LabelFunction), false},
	{17, "Time to GPU memory exhaustion, the pods' GPUs",
		"When each GPU the pods grow on runs out of memory at the rate its processes grow: NVML's free memory over the sum " +
			"of their rates (docs/leaks.md). Nothing while nothing grows.",
		peakWidth, units.Seconds, metrics.ExhaustionSecondsName + " and on (" + metrics.LabelNode + ", " + schema.GPU + ") " +
			selector(metrics.ExhaustionShareName), legend(metrics.LabelNode) + " gpu " + legend(schema.GPU), false},
}

// GPUMem builds the dashboard, in Grafana's classic JSON model (package
// dashboard, which the SDK marks deprecated in favour of dashboardv2, a
// Kubernetes-style resource only Grafana 12's new API takes): the model
// Grafana's import, file provisioning and the chart's sidecar read.
func GPUMem() (dashboard.Dashboard, error) {
	d := dashboard.NewDashboardBuilder(title).
		Uid(uid).
		Description("Which function, in which pod, holds how much GPU memory (gpu-mem: https://github.com/gpu-mem/gpu-mem)").
		Tags([]string{"gpu", "cuda", "memory", "pyroscope"}).
		Version(version).
		Editable().
		Time("now-1h", "now").
		Refresh("30s").
		WithVariable(dashboard.NewDatasourceVariableBuilder(varPyroscope).Label("Pyroscope").Type(pyroscopePlugin)).
		WithVariable(dashboard.NewDatasourceVariableBuilder(varPrometheus).Label("Prometheus").Type(prometheusPlugin)).
		WithVariable(labelVariable(varNamespace, schema.Namespace)).
		WithVariable(labelVariable(varPod, schema.Pod)).
		WithVariable(labelVariable(varService, pyroscope.LabelService).
			Description("Filters the flame graphs only: service_name is Pyroscope's label, which the Prometheus " +
				"series do not carry (namespace and pod filter both)."))
	// The builder lays panels out left to right, a new row when one is full.
	for _, f := range flameGraphs {
		d.WithPanel(f.panel())
	}
	for _, s := range seriesPanels {
		d.WithPanel(s.panel())
	}
	return d.Build()
}

// JSON is the dashboard as the generator writes it: indented, <, > and &
// as they are (not \u003c...), ending in a newline.
func JSON() ([]byte, error) {
	d, err := GPUMem()
	if err != nil {
		return nil, fmt.Errorf("build dashboard: %w", err)
	}
	return encode(d)
}

func encode(d dashboard.Dashboard) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(d); err != nil {
		return nil, fmt.Errorf("encode dashboard: %w", err)
	}
	return b.Bytes(), nil
}

func pyroscopeSource() common.DataSourceRef { return source(pyroscopePlugin, varPyroscope) }

func prometheusSource() common.DataSourceRef { return source(prometheusPlugin, varPrometheus) }

// source is a data source picked by a datasource variable.
func source(plugin, variable string) common.DataSourceRef {
	uid := "${" + variable + "}"
	return common.DataSourceRef{Type: &plugin, Uid: &uid}
}

// profileTypeID is the Pyroscope profile type of a sample type of a view.
func profileTypeID(v memory.View, sampleType int) string {
	return pyroscope.ProfileTypeID(pprof.SampleTypes(v)[sampleType])
}

// labelVariable is a variable of the values of a label the exporter pushes,
// any number of them, all by default, read again when the time range
// changes.
func labelVariable(name, label string) *dashboard.QueryVariableBuilder {
	all := "All"
	allValue := "$__all"
	return dashboard.NewQueryVariableBuilder(name).
		Label(label).
		Datasource(pyroscopeSource()).
		// The SDK has no type for the Pyroscope data source's variable
		// queries: the plugin's fields as a map.
		Query(dashboard.StringOrMap{Map: map[string]any{
			"queryType":     "labelValue",
			"labelName":     label,
			"profileTypeId": profileTypeID(memory.ViewDriver, pprof.InuseSpace),
			"refId":         name,
		}}).
		IncludeAll(true).
		AllValue(".*").
		Multi(true).
		Current(dashboard.VariableOption{Text: dashboard.StringOrArrayOfString{String: &all},
			Value: dashboard.StringOrArrayOfString{String: &allValue}}).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged)
}

// panel is the flame graph: the SDK has no flame graph panel type, so a
// plain panel of Grafana's "flamegraph" plugin, which has no options.
func (f flameGraph) panel() cog.Builder[dashboard.Panel] {
	p := dashboard.NewPanelBuilder()
	if f.atAMoment() {
		p.TimeFrom(lastInterval).TimeShift(lastIntervalShift)
	}
	return p.
		Type("flamegraph").
		Id(f.id).
		Title(f.title).
		Description(f.description).
		Datasource(pyroscopeSource()).
		Height(flameHeight).
		Span(flameWidth).
		WithTarget(grafanapyroscope.NewDataqueryBuilder().
			RefId("A").
			Datasource(pyroscopeSource()).
			QueryType(string(grafanapyroscope.PyroscopeQueryTypeProfile)).
			ProfileTypeId(f.profileTypeID()).
			LabelSelector(labelSelector(f.view)).
			GroupBy([]string{}))
}

// labelSelector filters profiles of view v by the variables, the driver
// view's to the GPUs' memory.
func labelSelector(v memory.View) string {
	matchers := []string{
		match(pyroscope.LabelService, varService),
		match(schema.Namespace, varNamespace),
		match(schema.Pod, varPod),
	}
	if v == memory.ViewDriver {
		matchers = append(matchers, onGPUs)
	}
	return "{" + strings.Join(matchers, ", ") + "}"
}

func (s series) panel() cog.Builder[dashboard.Panel] {
	p := timeseries.NewPanelBuilder()
	if s.perPod {
		p.Repeat(varPod).RepeatDirection(dashboard.PanelRepeatDirectionH).MaxPerRow(2).
			FillOpacity(70).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal))
	}
	return p.
		Id(s.id).
		Title(s.title).
		Description(s.description).
		Datasource(prometheusSource()).
		Height(seriesHeight).
		Span(s.width).
		Unit(s.unit).
		// Grafana's own defaults, which the SDK's panel does not start
		// with (its legend is hidden, its tooltip has no mode): a legend
		// names each pod's or process's line.
		Legend(common.NewVizLegendOptionsBuilder().
			DisplayMode(common.LegendDisplayModeList).
			Placement(common.LegendPlacementBottom).
			ShowLegend(true)).
		Tooltip(common.NewVizTooltipOptionsBuilder().
			Mode(common.TooltipDisplayModeSingle).
			Sort(common.SortOrderNone)).
		WithTarget(prometheus.NewDataqueryBuilder().
			RefId("A").
			Datasource(prometheusSource()).
			Expr(s.expr).
			LegendFormat(s.legend))
}

// selector selects a metric's series of the pods the variables pick, and
// of the other matchers given.
func selector(metric string, matchers ...string) string {
	matchers = append(matchers, match(schema.Namespace, varNamespace), match(schema.Pod, varPod))
	return metric + "{" + strings.Join(matchers, ", ") + "}"
}

// match matches a label against a (multi-value) variable's values, as
// both data sources read them. ${var:regex} is Grafana's regex format:
// one value escaped as a regular expression, several as (a|b), All as the
// variable's All value unformatted. A bare $var would take each data
// source's default instead: Pyroscope's is a glob, {a,b}, which as a
// regular expression matches nothing. The raw string (backquotes) keeps
// the escapes Grafana writes (\. and \/ in a pod or service name), which a
// double-quoted string of either data source's selector parser refuses.
func match(label, variable string) string { return label + "=~`${" + variable + ":regex}`" }

func equal(label, value string) string { return label + "=" + strconv.Quote(value) }

func notEqual(label, value string) string { return label + "!=" + strconv.Quote(value) }

// onGPUs leaves out what lives in the host's RAM (page-locked host
// memory, VMM memory made on the host): it is in the driver view's series
// with gpu="host", and it is not GPU memory.
var onGPUs = notEqual(schema.GPU, memory.GPUHost)

func sumBy(labels []string, expr string) string { return aggregate("sum", labels, expr) }

func maxBy(labels []string, expr string) string { return aggregate("max", labels, expr) }

func aggregate(op string, labels []string, expr string) string {
	return op + " by (" + strings.Join(labels, ", ") + ") (" + expr + ")"
}

// legend is a legend's reference to a label's value.
func legend(label string) string { return "{{" + label + "}}" }
