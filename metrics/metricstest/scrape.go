// Package metricstest scrapes a metrics endpoint the way Prometheus does,
// for tests: a real HTTP GET, read with the Prometheus text parser.
package metricstest

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape returns the metric families served at url.
func Scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	families, err := Get(url)
	if err != nil {
		t.Fatal(err)
	}
	return families
}

// Get returns the metric families served at url, for a program that is
// not a test (the soak).
func Get(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return families, nil
}

// ScrapeUntil scrapes url until ready says the families hold what the test
// waits for (the agent reads events a moment after they are sent), and
// returns them; after limit, the last scrape, for the test to say what is
// wrong with it.
func ScrapeUntil(t testing.TB, url string, limit time.Duration, ready func(map[string]*dto.MetricFamily) bool) map[string]*dto.MetricFamily {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		families := Scrape(t, url)
		if ready(families) || time.Now().After(deadline) {
			return families
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Labels are a metric's labels by name.
func Labels(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}
