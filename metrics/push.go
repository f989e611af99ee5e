package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-mem/gpu-mem/pyroscope"
)

// PushSource is what the push metrics read: the Pyroscope exporter's
// counts.
type PushSource interface {
	Stats() pyroscope.Stats
}

// PushCollector exposes a Pyroscope exporter's counts, read at each
// scrape.
type PushCollector struct{ Source PushSource }

var (
	pushed = newMetric("gpumem_pyroscope_pushed_total", prometheus.CounterValue, nil,
		"Intervals delivered to Pyroscope.")
	pushFailures = newMetric("gpumem_pyroscope_push_failures_total", prometheus.CounterValue, nil,
		"Push attempts that failed and are retried.")
	rejected = newMetric("gpumem_pyroscope_rejected_total", prometheus.CounterValue, []string{LabelReason},
		"Intervals Pyroscope refused for their content, dropped, by reason: the gRPC code, or the HTTP status of a plain HTTP answer.")
	dropped = newMetric("gpumem_pyroscope_dropped_total", prometheus.CounterValue, []string{LabelReason},
		"Intervals dropped unsent, by reason: queue_full (the oldest, for a newer one) or expired (older than Pyroscope accepts).")
	queued = newMetric("gpumem_pyroscope_queued", prometheus.GaugeValue, nil,
		"Intervals waiting to be pushed.")
)

var pushMetrics = []*Metric{pushed, pushFailures, rejected, dropped, queued}

// Describe sends the push metrics' descriptions.
func (c PushCollector) Describe(ch chan<- *prometheus.Desc) { describe(ch, pushMetrics) }

// Collect reads the exporter's counts.
func (c PushCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.Source.Stats()
	ch <- pushed.sample(float64(s.Pushed))
	ch <- pushFailures.sample(float64(s.Failed))
	for reason, n := range s.RejectedBy {
		ch <- rejected.sample(float64(n), reason)
	}
	ch <- dropped.sample(float64(s.Dropped), "queue_full")
	ch <- dropped.sample(float64(s.Expired), "expired")
	ch <- queued.sample(float64(s.Queued))
}
