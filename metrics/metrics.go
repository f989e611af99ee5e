// Package metrics exposes gpu-mem's books to Prometheus: live bytes,
// allocated bytes, allocation, free and failure counts per process, memory
// kind and GPU, the tracer's loss counters, read at each scrape, and each
// process's peak per GPU of the agent's last interval, and the Pyroscope
// exporter's counts (PushCollector). The tensor view has
// metrics of its own (gpumem_tensor_*): a tensor's bytes are also in the
// driver's segment that holds it, so that sum(gpumem_live_bytes) is the
// driver view alone, what the GPUs hold.
package metrics

import (
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/report"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// Source is what a scrape reads: the profiler's totals.
type Source interface {
	Totals() (snapshot.Totals, error)
}

// PeakSource is what the peak gauges read: each process's peaks of the
// agent's last interval.
type PeakSource interface {
	Peaks() []snapshot.Peak
}

// BreakdownSource is what the breakdown gauges read: each process's
// breakdown at the end of the agent's last interval.
type BreakdownSource interface {
	Breakdown() []snapshot.Breakdown
}

// GrowthSource is what the growth gauges read: the rows growing at the end
// of the agent's last interval, and each GPU's time to exhaustion.
type GrowthSource interface {
	Growing() []snapshot.Growing
	Exhaustion() []snapshot.Exhaustion
}

// Labels of the metrics besides a row's (package schema's), for queries
// (dashboards/).
const (
	LabelCode   = "code"   // gpumem_failures_total's CUresult
	LabelReason = "reason" // gpumem_losses_total's
)

var labels = []string{schema.PID, schema.Comm, schema.Kind, schema.GPU, schema.Namespace, schema.Pod, schema.Container, schema.PodUID, schema.ContainerID}

// peakLabels are the peak gauges' labels: a peak is of a view, not of a
// kind (on a GPU, the driver view's device and VMM memory together).
var peakLabels = slices.DeleteFunc(slices.Clone(labels), func(l string) bool { return l == schema.Kind })

// Names are the names of one view's metrics.
type Names struct {
	LiveBytes, AllocatedBytes, Allocations, Frees, PeakBytes string
}

// ViewNames are view v's metric names: gpumem_* for the driver view,
// gpumem_tensor_* for the tensor view.
func ViewNames(v memory.View) Names { return viewNames[v] }

func newNames(prefix string) Names {
	return Names{LiveBytes: prefix + "live_bytes", AllocatedBytes: prefix + "allocated_bytes_total",
		Allocations: prefix + "allocations_total", Frees: prefix + "frees_total", PeakBytes: prefix + "peak_bytes"}
}

var viewNames = [...]Names{memory.ViewDriver: newNames("gpumem_"), memory.ViewTensor: newNames("gpumem_tensor_")}

// Names of the metrics of neither view.
const (
	FailuresName  = "gpumem_failures_total"
	LossesName    = "gpumem_losses_total"
	LostBytesName = "gpumem_lost_bytes_total"
	// The agent's state.
	StateJournalBytesName = "gpumem_state_journal_bytes"
	StateRefusedName      = "gpumem_state_refused_total"
	UnknownFreesName      = "gpumem_unknown_frees_total"
	// The on-demand tensor view's.
	TensorViewSinceName      = "gpumem_tensor_view_since_seconds"
	FreesBeforeViewName      = "gpumem_tensor_frees_before_view_total"
	TensorBudgetExceededName = "gpumem_tensor_view_budget_exceeded_total"
	// The driver view's budget.
	DriverViewOffSinceName   = "gpumem_driver_view_off_since_seconds"
	DriverCallsNotTracedName = "gpumem_driver_calls_not_traced_total"
	DriverBudgetExceededName = "gpumem_driver_view_budget_exceeded_total"
	// NVML's, per GPU.
	GPUUsedName  = "gpumem_gpu_used_bytes"
	GPUTotalName = "gpumem_gpu_total_bytes"
	// The breakdown's, per process, GPU and category.
	BreakdownName = "gpumem_breakdown_bytes"
	// The growth's (package growth), per process, GPU and view, and per
	// GPU.
	GrowingBytesPerSecondName = "gpumem_growing_bytes_per_second"
	GrowingStacksName         = "gpumem_growing_stacks"
	GrowingSecondsName        = "gpumem_growing_seconds"
	ExhaustionSecondsName     = "gpumem_exhaustion_seconds"
	ExhaustionShareName       = "gpumem_exhaustion_share"
)

// Labels of the breakdown gauges.
const (
	LabelCategory = "category" // parameters, kv_cache, ... (package snapshot's names)
	LabelLibrary  = "library"  // library_workspaces' library; empty for the others
	// The growth gauges': the view (driver, tensor), the function that
	// called on the stack growing fastest, and the agent's node.
	LabelView     = "view"
	LabelFunction = "function"
	LabelNode     = "node"
)

// Metric is one metric gpu-mem exports. The collectors describe and send
// their metrics through these alone, and docs/reference/metrics.md is
// generated from Reference, so that the reference names what a scrape
// returns: name, type, labels and help.
type Metric struct {
	Name   string
	Type   prometheus.ValueType
	Labels []string
	Help   string
	desc   *prometheus.Desc
}

func newMetric(name string, typ prometheus.ValueType, labels []string, help string) *Metric {
	return &Metric{Name: name, Type: typ, Labels: labels, Help: help, desc: prometheus.NewDesc(name, help, labels, nil)}
}

// sample is one sample of m, of its type.
func (m *Metric) sample(v float64, labelValues ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(m.desc, m.Type, v, labelValues...)
}

// since is a sample of counter m that counts from zero at start (its
// created timestamp, which Prometheus's created-timestamp-zero-ingestion
// turns into a zero sample, so that rate and increase count what came
// before the first scrape), or from an unknown start if start is zero.
func (m *Metric) since(start time.Time, v float64, labelValues ...string) prometheus.Metric {
	if start.IsZero() {
		return m.sample(v, labelValues...)
	}
	return prometheus.MustNewConstMetricWithCreatedTimestamp(m.desc, m.Type, v, start, labelValues...)
}

// viewMetrics are the metrics of one view's series.
type viewMetrics struct {
	liveBytes, allocatedBytes, allocations, frees, peakBytes *Metric
}

// newViewMetrics describes a view's metrics, in whose words their help
// says what is counted.
func newViewMetrics(n Names, what string) viewMetrics {
	return viewMetrics{
		liveBytes:      newMetric(n.LiveBytes, prometheus.GaugeValue, labels, what+": bytes allocated and not freed."),
		allocatedBytes: newMetric(n.AllocatedBytes, prometheus.CounterValue, labels, what+": bytes allocated."),
		allocations:    newMetric(n.Allocations, prometheus.CounterValue, labels, what+": allocations."),
		frees:          newMetric(n.Frees, prometheus.CounterValue, labels, what+": frees, explicit and at process exit."),
		peakBytes: newMetric(n.PeakBytes, prometheus.GaugeValue, peakLabels, what+": the most bytes the process held at once on the GPU "+
			"during the agent's last interval (--pyroscope-interval), however briefly."),
	}
}

// series are the metrics of a view's series, peaks aside.
func (v viewMetrics) series() []*Metric {
	return []*Metric{v.liveBytes, v.allocatedBytes, v.allocations, v.frees}
}

// views are each view's metrics, by memory.View.
var views = [...]viewMetrics{
	memory.ViewDriver: newViewMetrics(viewNames[memory.ViewDriver], "Driver view (memory from the CUDA driver, what the GPU holds)"),
	memory.ViewTensor: newViewMetrics(viewNames[memory.ViewTensor], "Tensor view (PyTorch's tensors, inside the driver view's segments: not to be added to it)"),
}

var (
	failures  = newMetric(FailuresName, prometheus.CounterValue, append(slices.Clone(labels), LabelCode), "Allocations the driver refused, by CUresult code (2: out of memory).")
	losses    = newMetric(LossesName, prometheus.CounterValue, []string{LabelReason}, "What the tracer could not deliver whole, by reason.")
	lostBytes = newMetric(LostBytesName, prometheus.CounterValue, nil, "Bytes of driver allocations whose events were lost (gpumem_losses_total{reason=\"ring_buffer_full\"}): "+
		"never charged to a process.")
	unknownFrees = newMetric(UnknownFreesName, prometheus.CounterValue, nil, "Frees of memory allocated before tracing began.")
	// An on-demand tensor view's process: its PID and name; the tensor
	// series of a process hold from this gauge's value on.
	tensorViewSince = newMetric(TensorViewSinceName, prometheus.GaugeValue, []string{schema.PID}, "When the process's on-demand tensor view began (Unix seconds): its gpumem_tensor_* series count from then on; "+
		"absent while off.")
	freesBeforeView = newMetric(FreesBeforeViewName, prometheus.CounterValue, nil, "Frees of tensors made before their process's tensor view began: neither unknown frees nor subtracted from anything.")
	budgetExceeded  = newMetric(TensorBudgetExceededName, prometheus.CounterValue, nil, "On-demand tensor views switched off because they cost their process more than the budget (--tensor-budget).")
	// A process whose driver view its budget switched off.
	driverViewOffSince = newMetric(DriverViewOffSinceName, prometheus.GaugeValue, []string{schema.PID}, "When the process's driver view was switched off by its budget "+
		"(--driver-budget; Unix seconds): its gpumem_* driver series are partial from then on.")
	driverCallsNotTraced = newMetric(DriverCallsNotTracedName, prometheus.CounterValue, []string{schema.PID}, "Driver calls of the process not traced since its driver view was switched off.")
	driverBudgetExceeded = newMetric(DriverBudgetExceededName, prometheus.CounterValue, nil, "Driver views switched off because they cost their process more than the budget (--driver-budget).")
	// NVML's numbers per GPU (gpu: NVML's index, nvidia-smi's); absent
	// without NVML. Each process's share is in gpumem_live_bytes, its
	// parts beyond the traced memory of kinds context, module, driver-internal and untraced.
	gpuUsed = newMetric(GPUUsedName, prometheus.GaugeValue, []string{schema.GPU, schema.GPUUUID}, "Memory in use on the GPU, as NVML says (nvidia-smi's memory.used): "+
		"its processes' (sum(gpumem_live_bytes) over the GPU, the kinds context, module, driver-internal and untraced included) and what is of no process.")
	gpuTotal = newMetric(GPUTotalName, prometheus.GaugeValue, []string{schema.GPU, schema.GPUUUID}, "The GPU's memory, as NVML says (nvidia-smi's memory.total).")
	// The agent's state (--state-dir), absent without one.
	stateJournalBytes = newMetric(StateJournalBytesName, prometheus.GaugeValue, nil, "The size of the agent's journal in its state directory (--state-dir): "+
		"what the next agent replays.")
	stateRefused = newMetric(StateRefusedName, prometheus.CounterValue, []string{LabelReason}, "The state a previous agent left, not continued by this one, by reason "+
		"(version, object, boot, ring, maps, corrupt): its books started afresh.")
)

// Inspektor Gadget's GPU observability dashboard (the AKS GPU profiling
// guide's) queries the metrics of IG's top_cuda_memory gadget under the
// names IG's metrics exporter gives them: per process and memory class
// (host_raw "0": on the GPU, "1": in host memory), bytes allocated, freed
// and released implicitly. gpu-mem sends the same names and labels from the
// driver view (GPUObservability), the three always together, so that the
// dashboard's subtraction of one from the others keeps every row.
const (
	IGAllocBytesName        = "mem_alloc_bytes_total"
	IGFreeBytesName         = "mem_free_bytes_total"
	IGImplicitFreeBytesName = "mem_implicit_free_bytes_total"
	// Labels as IG names its fields: host_raw is the key the dashboard
	// filters on, host its name (top_cuda_memory's enum: CUDA_MEM_DEVICE,
	// CUDA_MEM_HOST; the gadget's libcuda_mem_stats shows the same).
	LabelHostRaw     = "host_raw"
	LabelHost        = "host"
	LabelIGNamespace = "k8s_namespace"
	LabelIGPod       = "k8s_podname"
	LabelIGContainer = "k8s_containername"
)

var igLabels = []string{schema.PID, schema.Comm, LabelHost, LabelHostRaw, LabelIGNamespace, LabelIGPod, LabelIGContainer}

var (
	igAllocBytes = newMetric(IGAllocBytesName, prometheus.CounterValue, igLabels, "Driver view, as Inspektor Gadget's top_cuda_memory counts it: bytes allocated, "+
		"per process and memory class (host_raw 0: on the GPU: device, VMM and managed memory; 1: in host memory: host-pinned, and VMM memory placed on the host).")
	igFreeBytes = newMetric(IGFreeBytesName, prometheus.CounterValue, igLabels, "Driver view, as Inspektor Gadget's top_cuda_memory counts it: bytes freed by a free call, "+
		"per process and memory class.")
	igImplicitFreeBytes = newMetric(IGImplicitFreeBytesName, prometheus.CounterValue, igLabels, "Driver view, as Inspektor Gadget's top_cuda_memory counts it: bytes released without a free call "+
		"(the process's exit, its context's destruction), per process and memory class.")
)

// igMetrics are the metrics of Inspektor Gadget's GPU observability
// dashboard, sent with Collector.GPUObservability.
var igMetrics = []*Metric{igAllocBytes, igFreeBytes, igImplicitFreeBytes}

// bookMetrics are Collector's metrics but the peaks, in the reference's
// order.
var bookMetrics = slices.Concat(views[memory.ViewDriver].series(), views[memory.ViewTensor].series(),
	[]*Metric{failures, losses, lostBytes, unknownFrees, tensorViewSince, freesBeforeView, budgetExceeded,
		driverViewOffSince, driverCallsNotTraced, driverBudgetExceeded, gpuUsed, gpuTotal, stateJournalBytes, stateRefused})

// peakMetrics are the peak gauges, sent with a PeakSource.
var peakMetrics = []*Metric{views[memory.ViewDriver].peakBytes, views[memory.ViewTensor].peakBytes}

// breakdownBytes is the breakdown gauge, sent with a BreakdownSource.
var breakdownBytes = newMetric(BreakdownName, prometheus.GaugeValue, append(slices.Clone(peakLabels), LabelCategory, LabelLibrary),
	"Where the process's memory on the GPU went, by category (docs/breakdown.md), at the end of the agent's last interval: "+
		"the categories sum to what nvidia-smi says the process uses there (to its driver view without NVML).")

// growingLabels are the growing gauges': a process's on a GPU in a view.
var growingLabels = append(slices.Clone(peakLabels), LabelView, LabelFunction)

var (
	growingBytesPerSecond = newMetric(GrowingBytesPerSecondName, prometheus.GaugeValue, growingLabels,
		"How fast the process's memory on the GPU grows, in bytes per second: the sum over its growing stacks, those whose "+
			"low-water mark (the least they held in an interval) rose in each of the last --growth-intervals intervals; "+
			"function names the fastest's caller. Absent while none grows.")
	growingStacks = newMetric(GrowingStacksName, prometheus.GaugeValue, growingLabels,
		"How many of the process's stacks grow on the GPU (gpumem_growing_bytes_per_second's). Absent while none grows.")
	growingSeconds = newMetric(GrowingSecondsName, prometheus.GaugeValue, growingLabels,
		"How long the longest growing of the process's stacks on the GPU has grown, in seconds: since the end of the "+
			"last interval whose low-water mark did not rise. Absent while none grows.")
	exhaustionSeconds = newMetric(ExhaustionSecondsName, prometheus.GaugeValue, []string{schema.GPU, schema.GPUUUID, LabelNode},
		"When the GPU's memory runs out at the rate its processes' memory grows, in seconds from the agent's last interval: "+
			"its free memory (NVML's) and, for processes growing in their tensor view alone, the free space in their "+
			"allocators' segments, over the sum of the rates. Absent while nothing grows on it, or without NVML.")
	exhaustionShare = newMetric(ExhaustionShareName, prometheus.GaugeValue, append(slices.Clone(peakLabels), LabelNode, LabelFunction),
		"The process's share of its GPU's growth (gpumem_exhaustion_seconds; gpu is NVML's index, as there): its rate over the GPU's; "+
			"function names its fastest growing stack's caller.")
)

// growthMetrics are the growth gauges, sent with a GrowthSource.
var growthMetrics = []*Metric{growingBytesPerSecond, growingStacks, growingSeconds, exhaustionSeconds, exhaustionShare}

// Reference is every metric gpu-mem's collectors send: Collector's (the
// books, read at each scrape, and the peak gauges) and PushCollector's.
// The caller must not change them.
func Reference() (books, pushes []*Metric) {
	return slices.Concat(bookMetrics, peakMetrics, []*Metric{breakdownBytes}, growthMetrics, igMetrics), pushMetrics
}

// Collector is a prometheus.Collector over a Source and, if any, a
// PeakSource.
type Collector struct {
	Source    Source
	Peaks     PeakSource
	Breakdown BreakdownSource
	Growth    GrowthSource
	// Node is the growth gauges' node label.
	Node string
	// GPUObservability adds the metrics Inspektor Gadget's GPU
	// observability dashboard queries (mem_alloc_bytes_total and its two
	// companions).
	GPUObservability bool
}

// Describe sends the metrics' descriptions.
func (c Collector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, bookMetrics)
	if c.Peaks != nil {
		describe(ch, peakMetrics)
	}
	if c.Breakdown != nil {
		ch <- breakdownBytes.desc
	}
	if c.Growth != nil {
		describe(ch, growthMetrics)
	}
	if c.GPUObservability {
		describe(ch, igMetrics)
	}
}

func describe(ch chan<- *prometheus.Desc, ms []*Metric) {
	for _, m := range ms {
		ch <- m.desc
	}
}

// Collect reads the totals and sends one sample per series.
func (c Collector) Collect(ch chan<- prometheus.Metric) {
	t, err := c.Source.Totals()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(losses.desc, err)
		return
	}
	for _, s := range t.Series {
		values := append([]string{strconv.FormatUint(uint64(s.PID), 10), s.Comm, s.Kind.String(), s.GPU()}, containerLabels(s.Container)...)
		m := views[s.Kind.View()]
		ch <- m.liveBytes.sample(float64(s.LiveBytes()), values...)
		ch <- m.allocatedBytes.since(s.Since, float64(s.AllocBytes), values...)
		ch <- m.allocations.since(s.Since, float64(s.AllocCount), values...)
		ch <- m.frees.since(s.Since, float64(s.FreeCount+s.ImplicitFreeCount), values...)
	}
	for _, f := range withOutOfMemory(t) {
		values := append([]string{strconv.FormatUint(uint64(f.PID), 10), f.Comm, f.Kind.String(), f.GPU()}, containerLabels(f.Container)...)
		values = append(values, strconv.Itoa(int(f.Result)))
		ch <- failures.since(f.Since, float64(f.Count), values...)
	}
	for reason, n := range t.Losses {
		ch <- losses.sample(float64(n), schema.Loss(reason).String())
	}
	ch <- lostBytes.sample(float64(t.LostBytes))
	ch <- unknownFrees.sample(float64(t.UnknownFrees))
	for _, v := range t.TensorViews {
		if v.Ended.IsZero() && !v.Since.IsZero() {
			ch <- tensorViewSince.sample(float64(v.Since.UnixNano())/1e9, strconv.FormatUint(uint64(v.PID), 10))
		}
	}
	ch <- freesBeforeView.sample(float64(t.FreesBeforeView))
	ch <- budgetExceeded.sample(float64(t.BudgetExceeded))
	for _, v := range t.DriverViewsOff {
		pid := strconv.FormatUint(uint64(v.PID), 10)
		ch <- driverViewOffSince.sample(float64(v.Ended.UnixNano())/1e9, pid)
		ch <- driverCallsNotTraced.sample(float64(v.Calls), pid)
	}
	ch <- driverBudgetExceeded.sample(float64(t.DriverBudgetExceeded))
	if t.GPUMemory != nil {
		for _, g := range t.GPUMemory.GPUs {
			ch <- gpuUsed.sample(float64(g.Used), strconv.Itoa(g.Index), g.UUID)
			ch <- gpuTotal.sample(float64(g.Total), strconv.Itoa(g.Index), g.UUID)
		}
	}
	if st := t.State; st != nil {
		ch <- stateJournalBytes.sample(float64(st.JournalBytes))
		if st.Refused != "" {
			ch <- stateRefused.sample(1, st.Refused)
		}
	}
	if c.Peaks != nil {
		collectPeaks(ch, c.Peaks.Peaks())
	}
	if c.Breakdown != nil {
		collectBreakdown(ch, c.Breakdown.Breakdown())
	}
	if c.Growth != nil {
		collectGrowth(ch, c.Growth.Growing(), c.Growth.Exhaustion(), c.Node)
	}
	if c.GPUObservability {
		collectIG(ch, t.Series)
	}
}

// withOutOfMemory are t's failures and, at zero, an out-of-memory count
// for each series of the driver's allocations that has none: the series of
// a process's first out-of-memory failure is then there before it, and an
// increase over a window counts that failure.
func withOutOfMemory(t snapshot.Totals) []snapshot.SeriesFailures {
	counted := map[snapshot.SeriesKey]bool{}
	for _, f := range t.Failures {
		if f.Result == memory.CUDAOutOfMemory {
			counted[f.SeriesKey] = true
		}
	}
	out := slices.Clip(t.Failures)
	for _, s := range t.Series {
		if s.Kind.View() == memory.ViewDriver && !s.Kind.FromNVML() && !counted[s.SeriesKey] {
			out = append(out, snapshot.SeriesFailures{SeriesKey: s.SeriesKey, Comm: s.Comm, Container: s.Container,
				Since: s.Since, Result: memory.CUDAOutOfMemory})
		}
	}
	return out
}

// igClass is a process's memory of one class, in IG's words.
type igClass struct {
	pid     uint32
	hostRaw bool
}

// collectIG sends, per process and memory class, the driver view's bytes
// allocated, freed and released implicitly: three samples with the same
// labels, each class of a process with any driver memory.
func collectIG(ch chan<- prometheus.Metric, series []snapshot.Series) {
	sums := map[igClass]*snapshot.Series{}
	var order []igClass
	for _, s := range series {
		if s.Kind.View() != memory.ViewDriver || s.Kind.FromNVML() { // not what IG's gadget counts
			continue
		}
		k := igClass{s.PID, s.GPU() == memory.GPUHost}
		sum := sums[k]
		if sum == nil {
			sum = &snapshot.Series{SeriesKey: s.SeriesKey, Comm: s.Comm, Container: s.Container, Since: s.Since}
			sums[k] = sum
			order = append(order, k)
		}
		sum.Counters.Add(s.Counters)
	}
	for _, k := range order {
		s := sums[k]
		host, hostRaw := "CUDA_MEM_DEVICE", "0"
		if k.hostRaw {
			host, hostRaw = "CUDA_MEM_HOST", "1"
		}
		values := []string{strconv.FormatUint(uint64(s.PID), 10), s.Comm, host, hostRaw, s.Container.Namespace, s.Container.Pod, s.Container.Name}
		ch <- igAllocBytes.since(s.Since, float64(s.AllocBytes), values...)
		ch <- igFreeBytes.since(s.Since, float64(s.FreeBytes), values...)
		ch <- igImplicitFreeBytes.since(s.Since, float64(s.ImplicitFreeBytes), values...)
	}
}

// collectPeaks sends one gauge per peak: a process's on one GPU in one view.
func collectPeaks(ch chan<- prometheus.Metric, peaks []snapshot.Peak) {
	for _, pk := range peaks {
		values := append([]string{strconv.FormatUint(uint64(pk.PID), 10), pk.Comm, pk.GPU}, containerLabels(pk.Container)...)
		ch <- views[pk.View].peakBytes.sample(float64(pk.Bytes), values...)
	}
}

// collectBreakdown sends one gauge per part of each breakdown.
func collectBreakdown(ch chan<- prometheus.Metric, bs []snapshot.Breakdown) {
	for _, b := range bs {
		values := append([]string{strconv.FormatUint(uint64(b.PID), 10), b.Comm, b.GPU}, containerLabels(b.Container)...)
		for _, p := range b.Parts {
			ch <- breakdownBytes.sample(float64(p.Bytes), append(values, p.Category, p.Library)...)
		}
	}
}

// growingSum is a process's growing stacks on one GPU in one view.
type growingSum struct {
	first          snapshot.Growing // the fastest: growing is by rate
	bytesPerSecond float64
	stacks         int
	since          time.Time // the longest growing's start
}

// collectGrowth sends, per process, GPU and view, the sum of its growing
// stacks' rates, their count and the longest's time, labelled with the
// fastest's function; per GPU, the time to exhaustion and each process's
// share of it.
func collectGrowth(ch chan<- prometheus.Metric, growing []snapshot.Growing, exhaustion []snapshot.Exhaustion, node string) {
	type key struct {
		pid  uint32
		gpu  string
		view string
	}
	sums := map[key]*growingSum{}
	var order []key
	for _, g := range growing {
		k := key{g.PID, g.GPU(), g.Kind.View().String()}
		sum := sums[k]
		if sum == nil {
			sum = &growingSum{first: g, since: g.Since}
			sums[k] = sum
			order = append(order, k)
		}
		sum.bytesPerSecond += g.BytesPerSecond
		sum.stacks++
		if g.Since.Before(sum.since) {
			sum.since = g.Since
		}
	}
	for _, k := range order {
		sum := sums[k]
		g := sum.first
		values := append([]string{strconv.FormatUint(uint64(g.PID), 10), g.Comm, k.gpu}, containerLabels(g.Container)...)
		values = append(values, k.view, report.HottestFrame(g.Frames))
		ch <- growingBytesPerSecond.sample(sum.bytesPerSecond, values...)
		ch <- growingStacks.sample(float64(sum.stacks), values...)
		ch <- growingSeconds.sample(g.At.Sub(sum.since).Seconds(), values...)
	}
	for _, e := range exhaustion {
		gpu := strconv.Itoa(e.GPU)
		ch <- exhaustionSeconds.sample(e.Seconds, gpu, e.UUID, node)
		for _, p := range e.Processes {
			values := append([]string{strconv.FormatUint(uint64(p.PID), 10), p.Comm, gpu}, containerLabels(p.Container)...)
			ch <- exhaustionShare.sample(p.Share, append(values, node, report.HottestFrame(p.Frames))...)
		}
	}
}

// LastInterval keeps what the interval that ended last says for the
// gauges, totals and the growing rows only (no other rows): the agent sets
// it once per interval, and scrapes read it meanwhile. Safe for concurrent
// use.
type LastInterval struct {
	mu         sync.Mutex
	peaks      []snapshot.Peak
	breakdown  []snapshot.Breakdown
	growing    []snapshot.Growing
	exhaustion []snapshot.Exhaustion
}

// Set keeps an interval's (Profiler.EndInterval's) peaks, breakdown,
// growing rows and exhaustion.
func (l *LastInterval) Set(s *snapshot.Snapshot) {
	keptPeaks := make([]snapshot.Peak, len(s.Peaks))
	for i, pk := range s.Peaks {
		keptPeaks[i] = pk
		keptPeaks[i].Shares, keptPeaks[i].Rows = nil, nil
	}
	keptBreakdown := make([]snapshot.Breakdown, len(s.Breakdown))
	for i, b := range s.Breakdown {
		keptBreakdown[i] = b
		keptBreakdown[i].Parts = make([]snapshot.Part, len(b.Parts))
		for j, p := range b.Parts {
			keptBreakdown[i].Parts[j] = snapshot.Part{Category: p.Category, Library: p.Library, Bytes: p.Bytes}
		}
	}
	l.mu.Lock()
	l.peaks, l.breakdown = keptPeaks, keptBreakdown
	l.growing, l.exhaustion = slices.Clone(s.Growing), slices.Clone(s.Exhaustion)
	l.mu.Unlock()
}

// Growing are the growing rows kept; the caller must not change them.
func (l *LastInterval) Growing() []snapshot.Growing {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.growing
}

// Exhaustion is each GPU's time to exhaustion kept; the caller must not
// change it.
func (l *LastInterval) Exhaustion() []snapshot.Exhaustion {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.exhaustion
}

// Peaks are the peaks kept; the caller must not change them.
func (l *LastInterval) Peaks() []snapshot.Peak {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.peaks
}

// Breakdown is the breakdown kept; the caller must not change it.
func (l *LastInterval) Breakdown() []snapshot.Breakdown {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.breakdown
}

func containerLabels(c container.Identity) []string {
	return []string{c.Namespace, c.Pod, c.Name, c.PodUID, c.ContainerID}
}
