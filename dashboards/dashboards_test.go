package dashboards

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/grafanapyroscope"

	"github.com/gpu-mem/gpu-mem/memory"
)

// TestOutputsAreGenerated: every committed copy of the dashboard is the
// generator's output, byte for byte, so that a hand edit, or a change of
// the code without `go generate ./dashboards/...`, fails.
func TestOutputsAreGenerated(t *testing.T) {
	dashboard, err := JSON()
	if err != nil {
		t.Fatal(err)
	}
	outputs := map[string][]byte{RuleTemplatePath: RuleTemplate()}
	for _, out := range Outputs {
		outputs[out] = dashboard
	}
	for _, out := range RulesOutputs {
		outputs[out] = RulesFile()
	}
	for out, want := range outputs {
		got, err := os.ReadFile(filepath.Join("..", out))
		if err != nil {
			t.Errorf("%v: run go generate ./dashboards/...", err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what dashboards/gen writes (%s): run go generate ./dashboards/... and do not edit it by hand",
				out, firstDifference(got, want))
		}
	}
}

// firstDifference says where two files part, by line.
func firstDifference(got, want []byte) string {
	g, w := bytes.Split(got, []byte("\n")), bytes.Split(want, []byte("\n"))
	for i := 0; i < len(g) && i < len(w); i++ {
		if !bytes.Equal(g[i], w[i]) {
			return fmt.Sprintf("line %d is %q, want %q", i+1, g[i], w[i])
		}
	}
	return fmt.Sprintf("%d lines, want %d", len(g), len(w))
}

// TestSchema: the dashboard read back through the SDK's types (with
// Grafana's panel and query plugins registered) and written again is the
// same, byte for byte: every field written is one of Grafana's schema as
// the SDK knows it. (The SDK's strict decoder cannot tell: in v0.0.22 it
// returns an empty list of errors as an error and drops every panel.)
func TestSchema(t *testing.T) {
	plugins.RegisterDefaultPlugins()
	// The SDK files Pyroscope queries under "grafanapyroscope", not the
	// plugin's ID, by which the decoder looks a query's type up.
	pyroscopeQueries := grafanapyroscope.VariantConfig()
	pyroscopeQueries.Identifier = pyroscopePlugin
	cog.NewRuntime().RegisterDataqueryVariant(pyroscopeQueries)
	data, err := JSON()
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard.Dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("decode: %v", err)
	}
	again, err := encode(d)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, data) {
		t.Errorf("read back through the SDK's types, the dashboard changes: %s", firstDifference(again, data))
	}
}

// TestLayout: panel IDs are unique and panels lie on Grafana's 24-column
// grid without overlapping.
func TestLayout(t *testing.T) {
	d, err := GPUMem()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[uint32]bool{}
	var boxes []dashboard.GridPos
	for _, p := range d.Panels {
		if p.Panel == nil || p.Panel.Id == nil || p.Panel.GridPos == nil {
			t.Fatalf("panel without ID or position: %+v", p)
		}
		id, pos := *p.Panel.Id, *p.Panel.GridPos
		if ids[id] {
			t.Errorf("panel ID %d twice", id)
		}
		ids[id] = true
		if pos.W == 0 || pos.H == 0 || pos.X+pos.W > 24 {
			t.Errorf("panel %d at %+v: off the grid", id, pos)
		}
		for _, b := range boxes {
			if pos.X < b.X+b.W && b.X < pos.X+pos.W && pos.Y < b.Y+b.H && b.Y < pos.Y+pos.H {
				t.Errorf("panel %d at %+v overlaps one at %+v", id, pos, b)
			}
		}
		boxes = append(boxes, pos)
	}
}

// targets are the dashboard's queries: each panel's Pyroscope label
// selectors and Prometheus expressions.
func targets(t *testing.T) []string {
	t.Helper()
	d, err := GPUMem()
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	var panels struct {
		Panels []struct {
			Targets []struct {
				LabelSelector string `json:"labelSelector"`
				Expr          string `json:"expr"`
			}
		}
	}
	if err := json.Unmarshal(data, &panels); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range panels.Panels {
		for _, target := range p.Targets {
			out = append(out, target.LabelSelector+target.Expr)
		}
	}
	return out
}

// matchers finds a query's label matchers: label, operator, quote, value.
var matchers = regexp.MustCompile("([a-z_]+)(=~|!~|!=|=)([\"`])([^\"`]*)[\"`]")

// TestVariablesInRegexFormat: every matcher that reads a variable takes
// Grafana's regex format in a raw string (label=~`${var:regex}`), in both
// data sources. A bare $var is formatted as each data source's default:
// Pyroscope's is a glob, {a,b}, which matches nothing once two values are
// picked; and Grafana's regex escapes (\. \/) are refused in a
// double-quoted string by the selector parser both data sources use.
func TestVariablesInRegexFormat(t *testing.T) {
	variable := regexp.MustCompile(`^\$\{[a-z]+:regex\}$`)
	for _, q := range targets(t) {
		found := 0
		for _, m := range matchers.FindAllStringSubmatch(q, -1) {
			value := m[4]
			if !strings.Contains(value, "$") {
				continue
			}
			found++
			if m[2] != "=~" || m[3] != "`" || !variable.MatchString(value) {
				t.Errorf("%s: matcher %s reads a variable: want %s=~`${var:regex}`", q, m[0], m[1])
			}
		}
		if found != strings.Count(q, "$") {
			t.Errorf("%s: a variable outside a matcher", q)
		}
		if found == 0 {
			t.Errorf("%s: no variable: want namespace and pod at least", q)
		}
	}
}

// grafanaRegex is Grafana's regex format (its formatRegistry's "regex"):
// each value escaped as a regular expression, several in (a|b); the All
// value, .*, as it is (a custom All value is never formatted).
func grafanaRegex(values []string) string {
	if values == nil {
		return ".*"
	}
	escaped := make([]string, len(values))
	for i, v := range values {
		escaped[i] = regexp.MustCompile(`[\\^$*+?.()|[\]{}/]`).ReplaceAllString(v, `\$0`)
	}
	if len(escaped) == 1 {
		return escaped[0]
	}
	return "(" + strings.Join(escaped, "|") + ")"
}

// TestMultiValueSelection: with each variable's values substituted as
// Grafana substitutes them (one value, two, All), every matcher selects
// exactly the values picked, anchored as Prometheus and Pyroscope anchor a
// label's regular expression.
func TestMultiValueSelection(t *testing.T) {
	others := []string{"ml/trainerx", "mlxtrainer-5d9f8", "a", "ab"}
	for _, picked := range [][]string{{"ml/trainer-5d9f8"}, {"ml/trainer-5d9f8", "a.b"}, nil} {
		formatted := grafanaRegex(picked)
		for _, q := range targets(t) {
			for _, m := range matchers.FindAllStringSubmatch(q, -1) {
				if !strings.Contains(m[4], "$") {
					continue
				}
				// The value is ${var:regex} (TestVariablesInRegexFormat), in a
				// raw string: Grafana's text is the regular expression.
				re, err := regexp.Compile("^(?:" + formatted + ")$")
				if err != nil {
					t.Fatalf("%s with %v: %v", m[0], picked, err)
				}
				for _, v := range picked {
					if !re.MatchString(v) {
						t.Errorf("%s with %v picked: %q not selected (%s)", m[0], picked, v, re)
					}
				}
				for _, v := range others {
					if picked != nil && re.MatchString(v) {
						t.Errorf("%s with %v picked: %q selected too (%s)", m[0], picked, v, re)
					}
				}
			}
		}
	}
}

// TestGPUPanelsLeaveHostMemoryOut: every panel of the driver view's GPU
// memory (held, allocated, peaks; flame graphs and time series) selects
// gpu!="host": page-locked host memory is in the driver view's series but
// is host RAM. The tensor view has none; failures are counted whatever the
// memory.
func TestGPUPanelsLeaveHostMemoryOut(t *testing.T) {
	for _, f := range flameGraphs {
		if got := strings.Contains(labelSelector(f.view), onGPUs); got != (f.view == memory.ViewDriver) {
			t.Errorf("%s: %s", f.title, labelSelector(f.view))
		}
	}
	for _, s := range seriesPanels {
		driver := strings.Contains(s.expr, driverMetrics.LiveBytes+"{") || strings.Contains(s.expr, driverMetrics.AllocatedBytes+"{") ||
			strings.Contains(s.expr, driverMetrics.PeakBytes+"{")
		if strings.Contains(s.expr, onGPUs) != driver {
			t.Errorf("%s: %s", s.title, s.expr)
		}
	}
	if onGPUs != `gpu!="host"` {
		t.Errorf("onGPUs %s", onGPUs)
	}
}
