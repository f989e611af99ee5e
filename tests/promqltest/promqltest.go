// Package promqltest runs tests/promql, a Prometheus for tests (its own
// scrape manager, TSDB, rule manager and PromQL engine; a module of its
// own), and asks it what a Prometheus server's API would answer.
package promqltest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Prometheus is a running tests/promql.
type Prometheus struct {
	t     *testing.T
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// Series is a series of an answer: a query's value, or raw samples.
type Series struct {
	Labels  map[string]string `json:"labels"`
	Value   *float64          `json:"value"`
	Samples []struct {
		T int64   `json:"t"`
		V float64 `json:"v"`
	} `json:"samples"`
}

// Alert is an alert of the rules evaluated, as it last fired.
type Alert struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	Value       float64           `json:"value"`
}

// startLimit bounds the build and start of tests/promql.
const startLimit = 5 * time.Minute

// Start builds tests/promql of the module at root and starts it scraping
// target (a URL) every 200 ms, with tests/promql's flags args (-rules FILE:
// its rules evaluated as often). It is stopped when the test ends.
func Start(t *testing.T, root, target string, args ...string) *Prometheus {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "promql")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join(root, "tests/promql")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build tests/promql: %v\n%s", err, out)
	}
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"-target", u.Host, "-path", u.Path, "-interval", "200ms", "-dir", t.TempDir()}, args...)...)
	cmd.Env = os.Environ()
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	scraping, logged := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(logged)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "promql: scraping") {
				close(scraping)
			}
			t.Log(sc.Text())
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-logged
		cmd.Wait()
	})
	select {
	case <-scraping:
	case <-logged:
		t.Fatal("tests/promql ended at start")
	case <-time.After(startLimit):
		t.Fatal("tests/promql did not start")
	}
	out := bufio.NewScanner(stdout)
	out.Buffer(nil, 64<<20)
	return &Prometheus{t: t, stdin: stdin, out: out}
}

// Ask sends one request and decodes its answer into into.
func (p *Prometheus) Ask(req map[string]any, into any) {
	p.t.Helper()
	line, _ := json.Marshal(req)
	fmt.Fprintf(p.stdin, "%s\n", line)
	if !p.out.Scan() {
		p.t.Fatalf("promql ended: %v", p.out.Err())
	}
	var failed struct{ Error string }
	if err := json.Unmarshal(p.out.Bytes(), &failed); err != nil || failed.Error != "" {
		p.t.Fatalf("%v: %v %s", req, err, failed.Error)
	}
	if err := json.Unmarshal(p.out.Bytes(), into); err != nil {
		p.t.Fatal(err)
	}
}

// Query is an instant query of expr at Unix ms ms.
func (p *Prometheus) Query(expr string, ms int64) []Series {
	p.t.Helper()
	var a struct{ Vector []Series }
	p.Ask(map[string]any{"query": expr, "at": ms}, &a)
	return a.Vector
}

// LabelValues are the values of label name of the series match selects,
// over all the data.
func (p *Prometheus) LabelValues(name, match string) []string {
	p.t.Helper()
	var a struct{ Values []string }
	p.Ask(map[string]any{"labelValues": name, "match": match}, &a)
	return a.Values
}

// Samples is every sample of the series sel selects, stale markers left
// out.
func (p *Prometheus) Samples(sel string) []Series {
	p.t.Helper()
	var a struct{ Series []Series }
	p.Ask(map[string]any{"samples": sel}, &a)
	return a.Series
}

// Alerts are the alerts of the rules (-rules) that fired so far, the last
// firing of each.
func (p *Prometheus) Alerts() []Alert {
	p.t.Helper()
	var a struct{ Alerts []Alert }
	p.Ask(map[string]any{"alerts": true}, &a)
	return a.Alerts
}
