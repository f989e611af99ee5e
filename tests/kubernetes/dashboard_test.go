package kubernetes

import (
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/tests/cgrouptest"
	"github.com/gpu-mem/gpu-mem/tests/promqltest"
)

// The queries of Inspektor Gadget's GPU observability dashboard (repository
// inspektor-gadget/grafana-dashboards, dashboards/gpu-observability/
// AdvancedGPUObservability.json, the one Azure's AKS GPU profiling guide
// imports), as that file has them: facts to test against.
const (
	igFilter = `{cluster=~"$cluster",k8s_namespace=~"$namespace",k8s_podname=~"$pod",host_raw="0"}`
	igActive = "mem_alloc_bytes_total" + igFilter + " - mem_free_bytes_total" + igFilter + " - mem_implicit_free_bytes_total" + igFilter
	// Total GPU Memory's filter has no pod matcher.
	igTotalFilter = `{cluster=~"$cluster",k8s_namespace=~"$namespace",host_raw="0"}`
)

var dashboardPanels = map[string]string{
	"GPU Active Memory by Pod":      "sum by (k8s_podname, pid) (\n  (" + igActive + ")\n)",
	"Top GPU Processes":             "topk(5,\n  sum by (k8s_podname, pid) (" + igActive + ")\n)",
	"GPU Memory Allocation Rate":    "sum by(k8s_podname, pid) (rate(mem_alloc_bytes_total" + igFilter + "[5m]))",
	"GPU Memory Free Rate":          "sum by(k8s_podname, pid) (rate(mem_free_bytes_total" + igFilter + "[5m]))",
	"GPU Memory Implicit Free Rate": "sum by(k8s_podname, pid) (rate(mem_implicit_free_bytes_total" + igFilter + "[5m]))",
	"Total GPU Memory": "sum(mem_alloc_bytes_total" + igTotalFilter + " - mem_free_bytes_total" + igTotalFilter +
		" - mem_implicit_free_bytes_total" + igTotalFilter + ")",
}

// The dashboard's variables, in its order; namespace and pod are
// multi-select with All, whose value is .*.
var dashboardVariables = []struct{ name, query string }{
	{"cluster", `label_values(mem_alloc_bytes_total, cluster)`},
	{"namespace", `label_values(mem_alloc_bytes_total{cluster=~"$cluster"}, k8s_namespace)`},
	{"pod", `label_values(mem_alloc_bytes_total{cluster=~"$cluster",k8s_namespace=~"$namespace"}, k8s_podname)`},
}

// The rate panels' window: rate() is bytes a second over it.
const rateWindow = 300

const MiB = 1 << 20

// TestGuideDashboard: a real Prometheus (its scrape manager, TSDB and
// PromQL engine: tests/promql) scrapes the agent while two pods of a real
// API server allocate on the simulated driver; one pod's process exits.
// Every panel of the guide's dashboard and every variable query, with the
// variables substituted as Grafana substitutes them (no cluster label, so
// cluster=~""; All = .*; one pod), answers exact bytes.
//
// Each process allocates 4 KiB (one call), is scraped, then allocates the
// rest: each counter's first sample is then its last, 0, or 4 KiB, and read
// at a scrape's time, rate() extrapolates it to exactly what the process
// counted (to the counter's zero at the start, to nothing at the end).
func TestGuideDashboard(t *testing.T) {
	c := startCluster(t)
	namespace(t, c, "ml")
	cids := map[string]string{"trainer": containerID, "server": strings.Repeat("5e", 32)}
	uids, pods := map[string]string{}, map[string]string{} // by app: the pod's UID and name
	for _, p := range []struct{ app, hash, suffix string }{{"trainer", "5d9f8", "x2x7z"}, {"server", "7c4b9", "k8m2p"}} {
		pod := replicaPod(t, c, "ml", p.app, p.hash, p.suffix, cids[p.app])
		uids[p.app], pods[p.app] = string(pod.UID), pod.Name
	}
	// The agent keeps an exited process one whole interval after the one
	// that read its exit: Prometheus scrapes its implicit frees then, every
	// 200 ms.
	agent, driver := startAgentFirst(t, 1, func(args ...string) *process {
		return start(t, nil, filepath.Join(root, "bin/gpumem"), args...)
	}, "--tensors=false", "--kubeconfig", c.kubeconfig, "--node-name", "node-1", "--metrics-address", "127.0.0.1:0",
		"--pyroscope-interval", "5s")
	prom := startPrometheus(t, agent.metricsURL(t))

	const first = 4096
	second := map[string]float64{"trainer": 32 * MiB, "server": 64 * MiB}
	freed := map[string]float64{"trainer": 8 * MiB, "server": 16 * MiB}
	work, pids := map[string]*process{}, map[string]string{}
	for _, app := range []string{"trainer", "server"} {
		w := start(t, driver.env, filepath.Join(root, "build/sim/simwork"), "grow", fmt.Sprint(first), fmt.Sprint(int64(second[app])), fmt.Sprint(int64(freed[app])))
		if !w.out.Scan() || !strings.HasPrefix(w.out.Text(), "ready ") {
			t.Fatal("workload did not start")
		}
		cgrouptest.InContainer(t, w.cmd.Process.Pid, uids[app], cids[app])
		fmt.Fprintln(w.stdin)
		if !w.out.Scan() || w.out.Text() != "first" {
			t.Fatalf("%s: no first step: %q", app, w.out.Text())
		}
		work[app], pids[app] = w, strconv.Itoa(w.cmd.Process.Pid)
	}
	for app, pid := range pids {
		prom.waitLast(t, `mem_alloc_bytes_total{pid="`+pid+`",host_raw="0"}`, first)
		fmt.Fprintln(work[app].stdin)
		if !work[app].out.Scan() || work[app].out.Text() != "done" {
			t.Fatalf("%s: no second step", app)
		}
		prom.waitLast(t, `mem_free_bytes_total{pid="`+pid+`",host_raw="0"}`, freed[app])
	}
	// The trainer exits at any point of an interval; the agent drops it at
	// the end of the next one, 5 to 10 s later. (Dropped at the end of the
	// interval its exit came in, an exit just before it ended was never
	// scraped: seen on CI.)
	fmt.Fprintln(work["trainer"].stdin)
	work["trainer"].cmd.Wait()
	held := first + second["trainer"] // never freed: released by the exit
	prom.waitLast(t, `mem_implicit_free_bytes_total{pid="`+pids["trainer"]+`",host_raw="0"}`, held)
	dropped := prom.waitGone(t, `mem_alloc_bytes_total{pid="`+pids["trainer"]+`"}`, `mem_alloc_bytes_total{pid="`+pids["server"]+`"}`)

	// Every series of the two processes has the pod's names from its first
	// sample on (a series renamed later would be a second series).
	for app, pid := range pids {
		for _, name := range []string{"mem_alloc_bytes_total", "mem_free_bytes_total", "mem_implicit_free_bytes_total"} {
			series := prom.samples(t, name+`{pid="`+pid+`"}`)
			var hostRaw []string
			for _, s := range series {
				hostRaw = append(hostRaw, s.Labels["host_raw"])
				if s.Labels["k8s_namespace"] != "ml" || s.Labels["k8s_podname"] != pods[app] {
					t.Errorf("%s of %s: labels %v", name, app, s.Labels)
				}
			}
			if slices.Sort(hostRaw); !slices.Equal(hostRaw, []string{"0", "1"}) {
				t.Errorf("%s of %s: host_raw %v, want one series each of 0 and 1", name, app, hostRaw)
			}
		}
	}

	// The variables, as Grafana asks for them.
	all := map[string]string{"cluster": "", "namespace": ".*", "pod": ".*"}
	wantValues := map[string][]string{"cluster": {}, "namespace": {"ml"}, "pod": {pods["server"], pods["trainer"]}}
	for _, v := range dashboardVariables {
		if got := prom.labelValues(t, grafana(v.query, all)); !slices.Equal(got, wantValues[v.name]) {
			t.Errorf("variable %s: %v, want %v", v.name, got, wantValues[v.name])
		}
	}

	// At the last scrape of the trainer: its memory released by its exit.
	trainerSamples := prom.samples(t, `mem_alloc_bytes_total{pid="`+pids["trainer"]+`",host_raw="0"}`)[0].Samples
	atExit := trainerSamples[len(trainerSamples)-1].T
	row := func(app string) string { return pods[app] + "/" + pids[app] }
	active := map[string]float64{row("trainer"): 0, row("server"): first + second["server"]}
	total := map[string]float64{"": first + second["server"]}
	wantAtExit := map[string]map[string]float64{
		"GPU Active Memory by Pod": active,
		"Top GPU Processes":        active,
		"GPU Memory Allocation Rate": {row("trainer"): first + second["trainer"] + freed["trainer"],
			row("server"): first + second["server"] + freed["server"]},
		"GPU Memory Free Rate":          {row("trainer"): freed["trainer"], row("server"): freed["server"]},
		"GPU Memory Implicit Free Rate": {row("trainer"): held, row("server"): 0},
		"Total GPU Memory":              total,
	}
	checkPanels(t, prom, "All, at the trainer's exit", all, atExit, wantAtExit)
	onePod := map[string]string{"cluster": "", "namespace": ".*", "pod": regexp.QuoteMeta(pods["server"])}
	wantServer := map[string]map[string]float64{}
	for panel, rows := range wantAtExit {
		wantServer[panel] = map[string]float64{}
		for r, v := range rows {
			if r != row("trainer") {
				wantServer[panel][r] = v
			}
		}
	}
	checkPanels(t, prom, "pod "+pods["server"]+", at the trainer's exit", onePod, atExit, wantServer)

	// Once the agent dropped the trainer, its active memory is gone from
	// the panels: its series are stale.
	afterDrop := map[string]map[string]float64{"GPU Active Memory by Pod": {row("server"): first + second["server"]},
		"Top GPU Processes": {row("server"): first + second["server"]}, "Total GPU Memory": total}
	checkPanels(t, prom, "All, after the trainer was dropped", all, dropped, afterDrop)
}

// checkPanels evaluates each panel of want at ms with the variables vars,
// rows keyed POD/PID (the Total panel's one row: ""); rate panels in bytes
// over the window, rounded to the byte.
func checkPanels(t *testing.T, prom *prometheus, when string, vars map[string]string, ms int64, want map[string]map[string]float64) {
	t.Helper()
	for panel, rows := range want {
		got := map[string]float64{}
		for _, s := range prom.query(t, grafana(dashboardPanels[panel], vars), ms) {
			v := *s.Value
			if strings.HasSuffix(panel, "Rate") {
				v = math.Round(v * rateWindow)
			}
			key := ""
			if s.Labels["k8s_podname"] != "" {
				key = s.Labels["k8s_podname"] + "/" + s.Labels["pid"]
			}
			got[key] = v
		}
		if !maps.Equal(got, rows) {
			t.Errorf("%s, %s: %v, want %v", panel, when, got, rows)
		}
	}
}

// grafana substitutes the dashboard's variables in expr as Grafana does,
// $name and ${name:regex} alike, from values already formatted (All's .*,
// a value regex-escaped).
func grafana(expr string, vars map[string]string) string {
	for name, value := range vars {
		expr = strings.ReplaceAll(expr, "${"+name+":regex}", value)
		expr = strings.ReplaceAll(expr, "$"+name, value)
	}
	return expr
}

// startPrometheus starts tests/promql scraping target (a URL) every 200
// ms, with tests/promql's flags args.
func startPrometheus(t *testing.T, target string, args ...string) *prometheus {
	t.Helper()
	return &prometheus{promqltest.Start(t, root, target, args...)}
}

// prometheus is tests/promql (package promqltest) and the waits of these
// tests.
type prometheus struct{ *promqltest.Prometheus }

func (pr *prometheus) query(t *testing.T, expr string, ms int64) []promqltest.Series {
	t.Helper()
	return pr.Query(expr, ms)
}

func (pr *prometheus) labelValues(t *testing.T, query string) []string {
	t.Helper()
	m := regexp.MustCompile(`^label_values\((.*), (\w+)\)$`).FindStringSubmatch(query)
	if m == nil {
		t.Fatalf("not a label_values query: %s", query)
	}
	return pr.LabelValues(m[2], m[1])
}

func (pr *prometheus) samples(t *testing.T, sel string) []promqltest.Series {
	t.Helper()
	return pr.Samples(sel)
}

// waitLast waits until the one series sel selects has last as its latest
// sample: Prometheus has scraped that state.
func (pr *prometheus) waitLast(t *testing.T, sel string, last float64) {
	t.Helper()
	waitfor.Value(t, fmt.Sprintf("scrape by Prometheus of %s = %v", sel, last), hangLimit, func() []promqltest.Series { return pr.samples(t, sel) },
		func(got []promqltest.Series) bool {
			return len(got) == 1 && len(got[0].Samples) > 0 && got[0].Samples[len(got[0].Samples)-1].V == last
		})
}

// waitGone waits until the series sel selects are stale while those kept
// selects are not (a failed scrape, a timeout on a busy machine, makes every
// series stale at once), and returns when (Unix ms) an instant query found
// it so.
func (pr *prometheus) waitGone(t *testing.T, sel, kept string) int64 {
	t.Helper()
	var now int64
	waitfor.Condition(t, fmt.Sprintf("%s gone with %s kept", sel, kept), hangLimit, func() bool {
		now = time.Now().UnixMilli()
		return len(pr.query(t, sel, now)) == 0 && len(pr.query(t, kept, now)) > 0
	})
	return now
}
