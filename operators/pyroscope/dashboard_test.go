package pyroscope

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDashboardQueriesWhatIsPushed: the dashboard's Pyroscope queries name
// the profile types and labels the exporter sends.
func TestDashboardQueriesWhatIsPushed(t *testing.T) {
	data, err := os.ReadFile("../../dashboards/gpu-mem.json")
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
	// The profile types Pyroscope derives from what is pushed: __name__,
	// then each sample type with the period type.
	pushed := map[string]bool{
		ProfileName + ":inuse_space:bytes:space:bytes": true,
		ProfileName + ":alloc_space:bytes:space:bytes": true,
	}
	// Labels the exporter sends; namespace and pod come with Kubernetes
	// metadata (empty, and matched by "All", elsewhere).
	labels := map[string]bool{LabelService: true, LabelPID: true, LabelComm: true, LabelKind: true, LabelNode: true, LabelGPU: true, "namespace": true, "pod": true}
	matcher := regexp.MustCompile(`([a-z_]+)=~?"`)
	metric := regexp.MustCompile(`\bgpumem_(live_bytes|allocated_bytes_total|failures_total)\{`)
	flames := 0
	for _, p := range d.Panels {
		for _, target := range p.Targets {
			if p.Type != "flamegraph" {
				// Prometheus panels: gpu-mem's metrics, by namespace and pod.
				if !metric.MatchString(target.Expr) || !strings.Contains(target.Expr, `pod=~"$pod"`) {
					t.Errorf("query %q", target.Expr)
				}
				continue
			}
			flames++
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
	if flames != 2 {
		t.Errorf("%d flame graph panels, want live and allocated", flames)
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
