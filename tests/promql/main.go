// Command promql is a Prometheus for tests: Prometheus's own scrape manager
// scrapes one target into Prometheus's TSDB (a folder of the caller's),
// Prometheus's rule manager evaluates the rules files given, and
// Prometheus's PromQL engine answers the requests the caller writes on
// stdin, one JSON object a line, each answered by one JSON line on stdout.
// tests/kubernetes's TestGuideDashboard runs it against the real agent to
// evaluate Inspektor Gadget's GPU observability dashboard as Grafana does.
//
// It is a module of its own (tests/promql/go.mod) because Prometheus's
// module cannot join the product's: its requirements raise
// go.opentelemetry.io/otel/log to v1.47, which the otel/sdk/log v0.19 that
// Inspektor Gadget v0.55.0 builds against does not compile with (undefined:
// log.KeyValue), and would move Kubernetes, moby and gRPC under the product
// for a test's sake. As a separate binary it imports nothing of gpu-mem's.
//
//	promql -target 127.0.0.1:9400 -path /metrics -interval 200ms -dir DIR [-created-timestamps] [-rules FILE]
//
// -created-timestamps is Prometheus's --enable-feature=created-timestamp-zero-ingestion:
// a counter's created timestamp (the protobuf exposition's, preferred then)
// becomes a zero sample before its first scraped one.
//
// -rules evaluates the rules file FILE every interval, as a Prometheus
// server's rule_files.
//
// Requests:
//
//	{"query": EXPR, "at": MS}            an instant query at Unix ms MS:
//	                                     {"vector": [{"labels": {...}, "value": V}]}
//	{"labelValues": NAME, "match": SEL}  the values of label NAME of the series
//	                                     SEL selects, over all the data (what
//	                                     Grafana's label_values(SEL, NAME) asks):
//	                                     {"values": [...]}, sorted
//	{"samples": SEL}                     every sample SEL selects, stale markers
//	                                     left out: {"series": [{"labels": {...},
//	                                     "samples": [{"t": MS, "v": V}]}]}
//	{"alerts": true}                     every alert that fired so far, the
//	                                     last of each: {"alerts": [{"name",
//	                                     "labels", "annotations", "value"}]}
//
// An answer that failed is {"error": "..."}.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/discovery/targetgroup"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/scrape"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
)

const job = "gpu-mem"

// selectors parses the selectors of label and sample requests.
var selectors = parser.NewParser(parser.Options{})

func main() {
	target := flag.String("target", "", "host:port to scrape")
	path := flag.String("path", "/metrics", "the target's metrics path")
	interval := flag.Duration("interval", 200*time.Millisecond, "scrape interval (and timeout)")
	dir := flag.String("dir", "", "the TSDB's folder")
	created := flag.Bool("created-timestamps", false, "ingest counters' created timestamps as zero samples")
	rulesFile := flag.String("rules", "", "a rules file to evaluate every interval")
	flag.Parse()
	if *target == "" || *dir == "" {
		fmt.Fprintln(os.Stderr, "usage: promql -target HOST:PORT -dir DIR [-path /metrics] [-interval 200ms] [-rules FILE]")
		os.Exit(2)
	}
	if err := run(*target, *path, *interval, *dir, *created, *rulesFile); err != nil {
		fmt.Fprintln(os.Stderr, "promql:", err)
		os.Exit(1)
	}
}

func run(target, path string, interval time.Duration, dir string, created bool, rulesFile string) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts := tsdb.DefaultOptions()
	opts.EnableSTAsZeroSample = created
	db, err := tsdb.Open(dir, logger, nil, opts, nil)
	if err != nil {
		return fmt.Errorf("open TSDB: %w", err)
	}
	defer db.Close()
	scraper, err := startScraping(logger, db, target, path, interval, created)
	if err != nil {
		return err
	}
	defer scraper.Stop()
	engine := promql.NewEngine(promql.EngineOpts{Logger: logger, MaxSamples: 50_000_000, Timeout: time.Minute,
		LookbackDelta: 5 * time.Minute, EnableAtModifier: true, EnableNegativeOffset: true})
	fired := &firedAlerts{last: map[string]alert{}}
	if rulesFile != "" {
		m, err := startRules(logger, db, engine, rulesFile, interval, fired)
		if err != nil {
			return err
		}
		defer m.Stop()
	}
	fmt.Fprintln(os.Stderr, "promql: scraping", target+path, "every", interval)
	return serve(os.Stdin, os.Stdout, engine, db, fired)
}

// startRules runs Prometheus's rule manager on the rules file, evaluated
// every interval against the TSDB, its recording rules written back, each
// alert firing noted in fired as a server would send it to Alertmanager.
func startRules(logger *slog.Logger, db *tsdb.DB, engine *promql.Engine, file string, interval time.Duration, fired *firedAlerts) (*rules.Manager, error) {
	m := rules.NewManager(&rules.ManagerOptions{
		AppendableV2: db,
		Queryable:    db,
		QueryFunc:    rules.EngineQueryFunc(engine, db),
		NotifyFunc:   fired.note,
		Context:      context.Background(),
		Logger:       logger,
		ResendDelay:  0, // every evaluation notifies what fires
		Parser:       parser.NewParser(parser.Options{}),
	})
	if err := m.Update(interval, []string{file}, labels.EmptyLabels(), "", nil); err != nil {
		return nil, fmt.Errorf("rules %s: %v", file, err)
	}
	go m.Run()
	return m, nil
}

// alert is one alert as it fired.
type alert struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	Value       float64           `json:"value"`
}

// firedAlerts keeps the last firing of each alert (by its labels) so far.
type firedAlerts struct {
	mu   sync.Mutex
	last map[string]alert
}

func (f *firedAlerts) note(_ context.Context, _ string, alerts ...*rules.Alert) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range alerts {
		if a.State != rules.StateFiring {
			continue
		}
		f.last[a.Labels.String()] = alert{Name: a.Labels.Get(labels.AlertName), Labels: a.Labels.Map(),
			Annotations: a.Annotations.Map(), Value: a.Value}
	}
}

func (f *firedAlerts) all() []alert {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []alert{}
	for _, a := range f.last {
		out = append(out, a)
	}
	return out
}

// startScraping runs Prometheus's scrape manager on one job, configured from
// YAML as a Prometheus server is, its one static target handed over as
// discovery would hand it. With created, as the server's
// created-timestamp-zero-ingestion feature sets it: protobuf first, and
// created timestamps ingested as zero samples.
func startScraping(logger *slog.Logger, db *tsdb.DB, target, path string, interval time.Duration, created bool) (*scrape.Manager, error) {
	protocols := config.DefaultScrapeProtocols
	if created {
		protocols = config.DefaultProtoFirstScrapeProtocols
	}
	names := make([]string, len(protocols))
	for i, p := range protocols {
		names[i] = string(p)
	}
	cfg, err := config.Load(fmt.Sprintf(`
global: {scrape_interval: %[1]s, scrape_timeout: %[1]s, scrape_protocols: [%[4]s]}
scrape_configs:
  - job_name: %[2]s
    metrics_path: %[3]s
`, model.Duration(interval), job, path, strings.Join(names, ", ")), logger)
	if err != nil {
		return nil, fmt.Errorf("scrape configuration: %w", err)
	}
	opts := &scrape.Options{EnableStartTimestampZeroIngestion: created, ParseST: created}
	m, err := scrape.NewManager(opts, logger, nil, nil, db, prometheus.NewRegistry())
	if err != nil {
		return nil, fmt.Errorf("scrape manager: %w", err)
	}
	if err := m.ApplyConfig(cfg); err != nil {
		return nil, fmt.Errorf("scrape configuration: %w", err)
	}
	targets := make(chan map[string][]*targetgroup.Group, 1)
	targets <- map[string][]*targetgroup.Group{job: {{Source: "static", Targets: []model.LabelSet{{model.AddressLabel: model.LabelValue(target)}}}}}
	go m.Run(targets)
	return m, nil
}

type request struct {
	Query       string `json:"query"`
	At          int64  `json:"at"`
	LabelValues string `json:"labelValues"`
	Match       string `json:"match"`
	Samples     string `json:"samples"`
	Alerts      bool   `json:"alerts"`
}

type sample struct {
	T int64   `json:"t"`
	V float64 `json:"v"`
}

type series struct {
	Labels  map[string]string `json:"labels"`
	Value   *float64          `json:"value,omitempty"`
	Samples []sample          `json:"samples,omitempty"`
}

type answer struct {
	Vector []series  `json:"vector,omitempty"`
	Values *[]string `json:"values,omitempty"`
	Series *[]series `json:"series,omitempty"`
	Alerts *[]alert  `json:"alerts,omitempty"`
	Error  string    `json:"error,omitempty"`
}

func serve(in *os.File, out *os.File, engine *promql.Engine, db *tsdb.DB, fired *firedAlerts) error {
	sc := bufio.NewScanner(in)
	enc := json.NewEncoder(out)
	for sc.Scan() {
		var req request
		var a answer
		var err error
		if err = json.Unmarshal(sc.Bytes(), &req); err == nil {
			switch {
			case req.Query != "":
				a.Vector, err = instant(engine, db, req.Query, req.At)
			case req.LabelValues != "":
				var v []string
				v, err = labelValues(db, req.LabelValues, req.Match)
				a.Values = &v
			case req.Samples != "":
				var s []series
				s, err = rawSamples(db, req.Samples)
				a.Series = &s
			case req.Alerts:
				all := fired.all()
				a.Alerts = &all
			default:
				err = fmt.Errorf("empty request")
			}
		}
		if err != nil {
			a = answer{Error: err.Error()}
		}
		if err := enc.Encode(a); err != nil {
			return err
		}
	}
	return sc.Err()
}

func instant(engine *promql.Engine, db storage.Queryable, expr string, at int64) ([]series, error) {
	q, err := engine.NewInstantQuery(context.Background(), db, nil, expr, time.UnixMilli(at))
	if err != nil {
		return nil, err
	}
	defer q.Close()
	res := q.Exec(context.Background())
	if res.Err != nil {
		return nil, res.Err
	}
	vector, err := res.Vector()
	if err != nil {
		return nil, err
	}
	out := []series{}
	for _, s := range vector {
		v := s.F
		out = append(out, series{Labels: s.Metric.Map(), Value: &v})
	}
	return out, nil
}

// selecting opens a querier over all the data and parses the selector sel.
func selecting(db *tsdb.DB, sel string) (storage.Querier, []*labels.Matcher, error) {
	matchers, err := selectors.ParseMetricSelector(sel)
	if err != nil {
		return nil, nil, err
	}
	q, err := db.Querier(math.MinInt64, math.MaxInt64)
	return q, matchers, err
}

// labelValues is what Prometheus's /api/v1/label/NAME/values?match[]=SEL
// answers over all the data.
func labelValues(db *tsdb.DB, name, sel string) ([]string, error) {
	q, matchers, err := selecting(db, sel)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	values, _, err := q.LabelValues(context.Background(), name, nil, matchers...)
	if values == nil {
		values = []string{}
	}
	return values, err
}

func rawSamples(db *tsdb.DB, sel string) ([]series, error) {
	q, matchers, err := selecting(db, sel)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	set := q.Select(context.Background(), true, nil, matchers...)
	out := []series{}
	for set.Next() {
		s := series{Labels: set.At().Labels().Map()}
		it := set.At().Iterator(nil)
		for it.Next() != 0 {
			if t, v := it.At(); !value.IsStaleNaN(v) {
				s.Samples = append(s.Samples, sample{t, v})
			}
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, set.Err()
}
