package pyroscope

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// TestDashboardQueriesWhatIsPushed: the dashboard's Pyroscope queries name
// the profile types and labels the exporter sends, with a flame graph of
// live bytes, of allocated bytes and of the interval's peak per view; its
// Prometheus panels query gpu-mem's metrics, live bytes and peaks per view,
// never both views in one query.
func TestDashboardQueriesWhatIsPushed(t *testing.T) {
	data, err := os.ReadFile("../dashboards/gpu-mem.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Type    string
			Targets []struct {
				ProfileTypeID string `json:"profileTypeId"`
				LabelSelector string `json:"labelSelector"`
				Expr          string `json:"expr"`
			}
		}
		Templating struct {
			List []struct {
				Name  string
				Query json.RawMessage
			}
		}
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	pushed := pushedProfileTypes(t)
	// Labels the exporter sends; namespace and pod come with Kubernetes
	// metadata (empty, and matched by "All", elsewhere).
	labels := map[string]bool{LabelService: true, schema.PID: true, schema.Comm: true, schema.Kind: true, LabelNode: true, schema.GPU: true,
		schema.Namespace: true, schema.Pod: true}
	matcher := regexp.MustCompile("([a-z_]+)(=~|!=|=)[\"`]")
	metric := regexp.MustCompile(`\bgpumem_(tensor_)?(live_bytes|peak_bytes|allocated_bytes_total|failures_total|breakdown_bytes|` +
		`growing_bytes_per_second|exhaustion_seconds|exhaustion_share)\b`)
	flames := map[string]int{}   // by profile type
	queried := map[string]bool{} // live bytes and peak metrics queried
	for _, p := range d.Panels {
		for _, target := range p.Targets {
			if p.Type != "flamegraph" {
				// Prometheus panels: gpu-mem's metrics, by namespace and pod.
				names := metric.FindAllStringSubmatch(target.Expr, -1)
				if len(names) == 0 || !strings.Contains(target.Expr, "pod=~`${pod:regex}`") {
					t.Errorf("query %q: want gpu-mem's metrics, by pod", target.Expr)
				}
				for _, m := range names {
					if m[2] == "live_bytes" || m[2] == "peak_bytes" {
						queried[m[0]+"{"] = true
					}
				}
				continue
			}
			flames[target.ProfileTypeID]++
			if !pushed[target.ProfileTypeID] {
				t.Errorf("profile type %q is not pushed", target.ProfileTypeID)
			}
			for _, m := range matcher.FindAllStringSubmatch(target.LabelSelector, -1) {
				if !labels[m[1]] {
					t.Errorf("selector %q uses label %q, which is not pushed", target.LabelSelector, m[1])
				}
			}
		}
	}
	for id := range pushed {
		if strings.Contains(id, "_space:") && flames[id] != 1 {
			t.Errorf("%d flame graph panels of %s, want one", flames[id], id)
		}
	}
	for _, name := range []string{"gpumem_live_bytes{", "gpumem_tensor_live_bytes{", "gpumem_peak_bytes{", "gpumem_tensor_peak_bytes{"} {
		if !queried[name] {
			t.Errorf("no panel of %s: want live bytes and peaks per view (%v)", name, queried)
		}
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	for _, name := range []string{"namespace", "pod", "service", "pyroscope", "prometheus"} {
		if !vars[name] {
			t.Errorf("no variable %s", name)
		}
	}
}

// pushedProfileTypes are the profile types Pyroscope files what the
// exporter pushes under, for a series of each view.
func pushedProfileTypes(t *testing.T) map[string]bool {
	types := map[string]bool{}
	for _, kind := range []memory.Kind{memory.KindDevice, memory.KindTensor} {
		e := &Exporter{series: map[seriesKey]*series{}}
		key, frames := accounting.Key{PID: 1, Stack: 1, Kind: kind}, []*symbolize.Frame{{Function: "f"}}
		req := e.request(time.Now(), func(add func(*snapshot.Row)) {
			add(&snapshot.Row{Key: key, Comm: "python3", Frames: frames, Counters: accounting.Counters{AllocBytes: 1, AllocCount: 1}})
		}, nil, []snapshot.Growing{{Key: key, Comm: "python3", Frames: frames, Grew: 1}}, views{})
		for _, s := range req.Series {
			p, err := profile.ParseData(s.Samples[0].RawProfile)
			if err != nil {
				t.Fatal(err)
			}
			for _, st := range p.SampleType {
				id := pyroscopetest.ProfileTypeID(s, p, st)
				if ProfileTypeID(st) != id {
					t.Errorf("ProfileTypeID(%v) = %q, Pyroscope files it as %q", st, ProfileTypeID(st), id)
				}
				types[id] = true
			}
		}
	}
	if len(types) != 14 {
		t.Fatalf("profile types pushed: %v", types)
	}
	return types
}
