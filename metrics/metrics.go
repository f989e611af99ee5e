// Package metrics exposes gpu-mem's books to Prometheus: live bytes,
// allocated bytes, allocation, free and failure counts per process, memory
// kind and GPU, and the tracer's loss counters, read at each scrape. The
// tensor view has metrics of its own (gpumem_tensor_*): a tensor's bytes
// are also in the driver's segment that holds it, so that
// sum(gpumem_live_bytes) is the driver view alone, what the GPUs hold.
package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-mem/gpu-mem/operators/k8smeta"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// Source is what a scrape reads: the profiler's totals.
type Source interface {
	Totals() (profiler.Totals, error)
}

var labels = []string{"pid", "comm", "kind", "gpu", "namespace", "pod", "container", "pod_uid", "container_id"}

// viewMetrics are the metrics of one view's series.
type viewMetrics struct {
	liveBytes, allocatedBytes, allocations, frees *prometheus.Desc
}

// newViewMetrics names a view's metrics with prefix, in whose words their
// help says what is counted.
func newViewMetrics(prefix, what string) viewMetrics {
	return viewMetrics{
		liveBytes:      prometheus.NewDesc(prefix+"live_bytes", what+": bytes allocated and not freed.", labels, nil),
		allocatedBytes: prometheus.NewDesc(prefix+"allocated_bytes_total", what+": bytes allocated.", labels, nil),
		allocations:    prometheus.NewDesc(prefix+"allocations_total", what+": allocations.", labels, nil),
		frees:          prometheus.NewDesc(prefix+"frees_total", what+": frees, explicit and at process exit.", labels, nil),
	}
}

// views are each view's metrics, by tracer.View.
var views = [...]viewMetrics{
	tracer.ViewDriver: newViewMetrics("gpumem_", "Driver view (memory from the CUDA driver, what the GPU holds)"),
	tracer.ViewTensor: newViewMetrics("gpumem_tensor_", "Tensor view (PyTorch's tensors, inside the driver view's segments: not to be added to it)"),
}

var (
	failures     = prometheus.NewDesc("gpumem_failures_total", "Allocations the driver refused, by CUresult code (2: out of memory).", append(labels, "code"), nil)
	losses       = prometheus.NewDesc("gpumem_losses_total", "What the tracer could not deliver whole, by reason.", []string{"reason"}, nil)
	unknownFrees = prometheus.NewDesc("gpumem_unknown_frees_total", "Frees of memory allocated before tracing began.", nil, nil)
)

// Collector is a prometheus.Collector over a Source.
type Collector struct {
	Source Source
}

// Describe sends the metrics' descriptions.
func (c Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range views {
		ch <- v.liveBytes
		ch <- v.allocatedBytes
		ch <- v.allocations
		ch <- v.frees
	}
	for _, d := range []*prometheus.Desc{failures, losses, unknownFrees} {
		ch <- d
	}
}

// Collect reads the totals and sends one sample per series.
func (c Collector) Collect(ch chan<- prometheus.Metric) {
	t, err := c.Source.Totals()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(losses, err)
		return
	}
	for _, s := range t.Series {
		values := append([]string{strconv.FormatUint(uint64(s.PID), 10), s.Comm, s.Kind.String(), s.GPU()}, containerLabels(s.Container)...)
		m := views[s.Kind.View()]
		ch <- prometheus.MustNewConstMetric(m.liveBytes, prometheus.GaugeValue, float64(s.LiveBytes()), values...)
		ch <- prometheus.MustNewConstMetric(m.allocatedBytes, prometheus.CounterValue, float64(s.AllocBytes), values...)
		ch <- prometheus.MustNewConstMetric(m.allocations, prometheus.CounterValue, float64(s.AllocCount), values...)
		ch <- prometheus.MustNewConstMetric(m.frees, prometheus.CounterValue, float64(s.FreeCount+s.ImplicitFreeCount), values...)
	}
	for _, f := range t.Failures {
		values := append([]string{strconv.FormatUint(uint64(f.PID), 10), f.Comm, f.Kind.String(), f.GPU()}, containerLabels(f.Container)...)
		values = append(values, strconv.Itoa(int(f.Result)))
		ch <- prometheus.MustNewConstMetric(failures, prometheus.CounterValue, float64(f.Count), values...)
	}
	l := t.Losses
	for reason, n := range map[string]uint64{
		"ring_buffer_full": l.RingBufferFull, "inflight_full": l.InflightFull,
		"result_unreadable": l.ResultUnreadable, "processes_full": l.ProcessesFull,
	} {
		ch <- prometheus.MustNewConstMetric(losses, prometheus.CounterValue, float64(n), reason)
	}
	ch <- prometheus.MustNewConstMetric(unknownFrees, prometheus.CounterValue, float64(t.UnknownFrees))
}

func containerLabels(c k8smeta.Container) []string {
	return []string{c.Namespace, c.Pod, c.Name, c.PodUID, c.ContainerID}
}
