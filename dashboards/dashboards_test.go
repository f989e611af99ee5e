package dashboards

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/grafanapyroscope"
)

// TestOutputsAreGenerated: every committed copy of the dashboard is the
// generator's output, byte for byte, so that a hand edit, or a change of
// the code without `go generate ./dashboards/...`, fails.
func TestOutputsAreGenerated(t *testing.T) {
	want, err := JSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range Outputs {
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
