//go:build pyroscopepeer

package kubernetes

// Built only with the tag pyroscopepeer, outside make test: it needs a real
// Grafana Pyroscope server, a test peer built outside the repository
// (shared/pyroscope-peer.md); tests/gpu/run_malloc_pyroscope.sh starts one
// and runs this test against it.

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	querierv1 "github.com/grafana/pyroscope/api/gen/proto/go/querier/v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/tests/cgrouptest"
)

// The guide's dashboard's flame graph: its profile type and label
// selector, as the dashboard file has them.
const (
	flameGraphType     = "process_cpu:malloc:bytes::"
	flameGraphSelector = `{k8s_namespace=~"${namespace:regex}",k8s_podName=~"${pod:regex}"}`
)

// The demo's allocations on the GPU by function (tests/workloads/simwork.c,
// demo): 12 x 64 MiB of weights, a 512 MiB KV cache, 64 steps of 16 + 8
// MiB of activations; its 32 MiB pinned staging buffer is host memory, left
// out as the dashboard's Prometheus panels leave it out (host_raw="0").
var demoAllocated = map[string]int64{"load_weights": 805306368, "allocate_kv_cache": 536870912,
	"forward_activation": 1610612736}

// TestGuideFlameGraph: the agent pushes to the real Pyroscope at
// GPUMEM_PYROSCOPE_URL while the demo runs in two pods of a real API server;
// the dashboard's flame graph query, with All and with one pod, gives each
// function's allocated bytes: twice the demo's, and the demo's.
func TestGuideFlameGraph(t *testing.T) {
	server := os.Getenv("GPUMEM_PYROSCOPE_URL")
	if server == "" {
		t.Fatal("GPUMEM_PYROSCOPE_URL: the real Pyroscope server (tests/gpu/run_malloc_pyroscope.sh starts one)")
	}
	c := startCluster(t)
	namespace(t, c, "ml")
	begin := time.Now().UnixMilli() // before the agent's first push
	agent, driver := startAgentFirst(t, 1, func(args ...string) *process {
		return start(t, nil, filepath.Join(root, "bin/gpumem"), args...)
	}, "--tensors=false", "--kubeconfig", c.kubeconfig, "--node-name", "node-1",
		"--pyroscope-interval", "1s", "--pyroscope-url", server)
	pods := map[string]string{}
	for i, app := range []string{"trainer", "server"} {
		cid := strings.Repeat(fmt.Sprintf("%02x", 0xa0+i), 32)
		pod := replicaPod(t, c, "ml", app, "5d9f8", "x2x7z", cid)
		pods[app] = pod.Name
		w := start(t, driver.env, filepath.Join(root, "build/sim/simwork"), "demo")
		if !w.out.Scan() || !strings.HasPrefix(w.out.Text(), "ready ") {
			t.Fatal("workload did not start")
		}
		cgrouptest.InContainer(t, w.cmd.Process.Pid, string(pod.UID), cid)
		fmt.Fprintln(w.stdin)
		if !w.out.Scan() || w.out.Text() != "done" {
			t.Fatalf("%s: the demo did not run", app)
		}
	}
	twice := map[string]int64{}
	for f, b := range demoAllocated {
		twice[f] = 2 * b
	}
	all := map[string]string{"namespace": ".*", "pod": ".*"}
	onePod := map[string]string{"namespace": ".*", "pod": pods["server"]}
	for _, q := range []struct {
		what string
		vars map[string]string
		want map[string]int64
	}{{"All", all, twice}, {"pod " + pods["server"], onePod, demoAllocated}} {
		selector := grafana(flameGraphSelector, q.vars)
		// Until the server has every interval the agent pushed.
		got := waitfor.Value(t, fmt.Sprintf("%s (%s): %v", q.what, selector, q.want), hangLimit,
			func() map[string]int64 { return allocatedBy(t, server, selector, begin, demoAllocated) },
			func(got map[string]int64) bool { return maps.Equal(got, q.want) })
		t.Logf("PASS %s %s: %v", q.what, selector, got)
	}
	agent.stop(t)
}

// allocatedBy asks Pyroscope for the flame graph of the dashboard's profile
// type under selector from begin to now, as the dashboard asks for it
// (querier.v1.QuerierService/SelectMergeStacktraces, Connect's JSON), and
// returns the bytes under each of funcs.
func allocatedBy(t *testing.T, server, selector string, begin int64, funcs map[string]int64) map[string]int64 {
	t.Helper()
	body, _ := protojson.Marshal(&querierv1.SelectMergeStacktracesRequest{ProfileTypeID: flameGraphType, LabelSelector: selector,
		Start: begin, End: time.Now().UnixMilli()})
	resp, err := http.Post(server+"/querier.v1.QuerierService/SelectMergeStacktraces", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("SelectMergeStacktraces: %s: %s", resp.Status, data)
	}
	var r querierv1.SelectMergeStacktracesResponse
	if err := protojson.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	under := functionTotals(r.GetFlamegraph())
	out := map[string]int64{}
	for f := range funcs {
		out[f] = under[f]
	}
	return out
}

// functionTotals is the bytes under each function name of a flame graph:
// a node's total, not counted again under an ancestor of the same name.
// A level is quadruples (x offset from the previous node's end, total,
// self, name index); a node's parent is the node of the level above whose
// span holds its x.
func functionTotals(fg *querierv1.FlameGraph) map[string]int64 {
	type node struct {
		x, total int64
		above    map[string]bool // the names on its path, its own included
	}
	out := map[string]int64{}
	parents := []node{{0, 1 << 62, map[string]bool{}}}
	for _, level := range fg.GetLevels() {
		var row []node
		v, x, j := level.GetValues(), int64(0), 0
		for i := 0; i+3 < len(v); i += 4 {
			x += v[i]
			name := fg.GetNames()[v[i+3]]
			for j < len(parents) && parents[j].x+parents[j].total <= x {
				j++
			}
			above := map[string]bool{}
			if j < len(parents) {
				maps.Copy(above, parents[j].above)
			}
			if !above[name] {
				out[name] += v[i+1]
			}
			above[name] = true
			row = append(row, node{x, v[i+1], above})
			x += v[i+1]
		}
		parents = row
	}
	return out
}
