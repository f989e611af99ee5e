package tests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	gadgetmanifest "github.com/inspektor-gadget/inspektor-gadget/pkg/gadget-manifest"
	otelmetrics "github.com/inspektor-gadget/inspektor-gadget/pkg/operators/otel-metrics"

	"github.com/gpu-mem/gpu-mem/breakdown"
	"github.com/gpu-mem/gpu-mem/operators/pyroscope"
	"github.com/gpu-mem/gpu-mem/tests/chartrender"
)

// render renders charts/gpu-mem and returns the objects by kind.
func render(t *testing.T, values map[string]any) map[string][]map[string]any {
	t.Helper()
	objects, err := chartrender.Render(repoRoot, "gpu", values)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	byKind := map[string][]map[string]any{}
	for _, obj := range objects {
		byKind[obj["kind"].(string)] = append(byKind[obj["kind"].(string)], obj)
	}
	return byKind
}

func dig(obj any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := obj.(map[string]any)
			obj = m[k]
		case int:
			s, _ := obj.([]any)
			if k >= len(s) {
				return nil
			}
			obj = s[k]
		}
	}
	return obj
}

func TestChartRenders(t *testing.T) {
	objects := render(t, nil)
	for _, kind := range []string{"DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service"} {
		if len(objects[kind]) != 1 {
			t.Errorf("%d %s, want 1", len(objects[kind]), kind)
		}
	}
	ds := objects["DaemonSet"][0]
	pod := dig(ds, "spec", "template", "spec")
	if dig(pod, "hostPID") != true {
		t.Error("not hostPID")
	}
	// Least privilege: named capabilities only (TestEachCapabilityIsNeeded
	// shows what each is for), no escalation, the runtime's seccomp profile.
	sc := dig(pod, "containers", 0, "securityContext")
	if dig(sc, "privileged") != false || dig(sc, "readOnlyRootFilesystem") != true || dig(sc, "allowPrivilegeEscalation") != false ||
		dig(sc, "seccompProfile", "type") != "RuntimeDefault" {
		t.Errorf("security context %v", sc)
	}
	caps := strings.Join(toStrings(dig(sc, "capabilities", "add")), ",")
	if caps != "BPF,PERFMON,SYS_PTRACE,CHECKPOINT_RESTORE" || strings.Join(toStrings(dig(sc, "capabilities", "drop")), ",") != "ALL" {
		t.Errorf("capabilities %v", dig(sc, "capabilities"))
	}
	if dig(pod, "nodeSelector", "nvidia.com/gpu.present") != "true" {
		t.Errorf("node selector %v", dig(pod, "nodeSelector"))
	}
	rules := dig(objects["ClusterRole"][0], "rules", 0)
	if strings.Join(toStrings(dig(rules, "verbs")), ",") != "get,list,watch" || strings.Join(toStrings(dig(rules, "resources")), ",") != "pods" {
		t.Errorf("RBAC %v", rules)
	}
	args := strings.Join(toStrings(dig(pod, "containers", 0, "args")), " ")
	if !strings.Contains(args, "agent --metrics-address=:9464") || !strings.Contains(args, "--tensors=on-demand") || strings.Contains(args, "--pyroscope-url") ||
		!strings.Contains(args, "--node-name=$(NODE_NAME)") {
		t.Errorf("args %s", args)
	}
	// Each value once: one flag for the node, not two with the same value.
	flags := map[string]int{}
	for _, arg := range toStrings(dig(pod, "containers", 0, "args")) {
		if name, _, _ := strings.Cut(arg, "="); strings.HasPrefix(name, "--") {
			flags[name]++
		}
	}
	for name, n := range flags {
		if n != 1 {
			t.Errorf("args %s: %s %d times", args, name, n)
		}
	}
}

func TestChartOptions(t *testing.T) {
	if objects := render(t, map[string]any{"gpuObservability": map[string]any{"enabled": false}}); len(objects) != 0 {
		t.Errorf("disabled chart renders %v", objects)
	}
	objects := render(t, map[string]any{
		"tensors":      "off",
		"logFormat":    "json",
		"pyroscope":    map[string]any{"url": "http://pyroscope:4040", "existingSecret": "pyro", "tenant": "team-a"},
		"metrics":      map[string]any{"serviceMonitor": map[string]any{"enabled": true}},
		"azureMonitor": map[string]any{"enabled": true},
	})
	pod := dig(objects["DaemonSet"][0], "spec", "template", "spec")
	args := strings.Join(toStrings(dig(pod, "containers", 0, "args")), " ")
	for _, want := range []string{"--tensors=off", "--log-format=json", "--pyroscope-url=http://pyroscope:4040", "--pyroscope-tenant=team-a", "--pyroscope-password-file=/etc/gpumem/pyroscope/password"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %s lack %s", args, want)
		}
	}
	if dig(pod, "volumes", 0, "secret", "secretName") != "pyro" {
		t.Errorf("volumes %v", dig(pod, "volumes"))
	}
	if len(objects["ServiceMonitor"]) != 1 {
		t.Error("no ServiceMonitor")
	}
	azure := named(objects["ConfigMap"], "ama-metrics-prometheus-config-node") // beside the dashboard's
	if azure == nil || dig(azure, "metadata", "namespace") != "kube-system" {
		t.Errorf("Azure Monitor config %v", objects["ConfigMap"])
	}
}

// named is the object of objects named name, or nil.
func named(objects []map[string]any, name string) map[string]any {
	for _, obj := range objects {
		if dig(obj, "metadata", "name") == name {
			return obj
		}
	}
	return nil
}

// TestChartDashboard: the chart ships the Grafana dashboard, the file
// dashboards/gen writes, in a ConfigMap labelled for Grafana's sidecar;
// dashboards.namespace and .folder place it, dashboards.enabled=false
// leaves it out.
func TestChartDashboard(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(repoRoot, "dashboards/gpu-mem.json"))
	if err != nil {
		t.Fatal(err)
	}
	cm := named(render(t, nil)["ConfigMap"], "r-gpu-mem-dashboard")
	if cm == nil {
		t.Fatal("no dashboard ConfigMap")
	}
	if dig(cm, "metadata", "labels", "grafana_dashboard") != "1" || dig(cm, "metadata", "namespace") != "gpu" {
		t.Errorf("dashboard ConfigMap's metadata %v", dig(cm, "metadata"))
	}
	if got, _ := dig(cm, "data", "gpu-mem.json").(string); got != string(want) {
		t.Errorf("the chart ships a dashboard of %d bytes, not dashboards/gpu-mem.json (%d bytes): run go generate ./dashboards/...", len(got), len(want))
	}
	cm = named(render(t, map[string]any{"dashboards": map[string]any{"namespace": "monitoring", "folder": "GPU"}})["ConfigMap"], "r-gpu-mem-dashboard")
	if dig(cm, "metadata", "namespace") != "monitoring" || dig(cm, "metadata", "annotations", "grafana_folder") != "GPU" {
		t.Errorf("dashboard ConfigMap's metadata %v", dig(cm, "metadata"))
	}
	if cms := render(t, map[string]any{"dashboards": map[string]any{"enabled": false}})["ConfigMap"]; len(cms) != 0 {
		t.Errorf("dashboards disabled: %v", cms)
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// TestGadgetInstanceManifest reads deploy/gadget-instance.yaml with IG's own
// manifest parser; its parameters are the Pyroscope operator's and IG's
// otel-metrics operator's, which exports top_cuda_memory's counters.
func TestGadgetInstanceManifest(t *testing.T) {
	f, err := os.Open(filepath.Join(repoRoot, "deploy/gadget-instance.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	specs, err := gadgetmanifest.InstanceSpecsFromReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 1 || specs[0].Name != "gpu-mem" {
		t.Fatalf("specs %+v", specs)
	}
	params := map[string]bool{}
	for _, p := range (pyroscope.Operator{}).InstanceParams() {
		params["operator."+pyroscope.Name+"."+p.Key] = true
	}
	for _, p := range otelmetrics.Operator.InstanceParams() {
		params["operator.otel-metrics."+p.Key] = true
	}
	for key := range specs[0].ParamValues {
		if !params[key] {
			t.Errorf("parameter %s is neither the Pyroscope operator's nor otel-metrics'", key)
		}
	}
	if name := specs[0].ParamValues["operator.otel-metrics."+otelmetrics.ParamOtelMetricsName]; name != "libcuda_mem_stats:libcuda_mem_stats" {
		t.Errorf("otel-metrics exports %q, want top_cuda_memory's counters, libcuda_mem_stats", name)
	}
}

// TestChartBreakdownRules: a user's rules (breakdownRules) are mounted from
// a ConfigMap and given to the agent; the text is a rules file the agent
// reads. Without them, no ConfigMap, no flag.
func TestChartBreakdownRules(t *testing.T) {
	const rules = "kv_cache function=Engine.allocate_cache\nparameters function=*.load_checkpoint\n"
	if _, err := breakdown.Parse(strings.NewReader(rules), "values"); err != nil {
		t.Fatal(err)
	}
	objects := render(t, map[string]any{"breakdownRules": rules, "pyroscope": map[string]any{"existingSecret": "pyro"}})
	cm := named(objects["ConfigMap"], "r-gpu-mem-breakdown-rules")
	if dig(cm, "data", "rules") != rules {
		t.Fatalf("ConfigMap %v", cm)
	}
	pod := dig(objects["DaemonSet"][0], "spec", "template", "spec")
	args := strings.Join(toStrings(dig(pod, "containers", 0, "args")), " ")
	if !strings.Contains(args, "--breakdown-rules=/etc/gpumem/breakdown/rules") {
		t.Errorf("args %s", args)
	}
	if dig(pod, "volumes", 1, "configMap", "name") != "r-gpu-mem-breakdown-rules" || dig(pod, "volumes", 0, "secret", "secretName") != "pyro" ||
		dig(pod, "containers", 0, "volumeMounts", 1, "mountPath") != "/etc/gpumem/breakdown" {
		t.Errorf("volumes %v, mounts %v", dig(pod, "volumes"), dig(pod, "containers", 0, "volumeMounts"))
	}
	objects = render(t, nil)
	pod = dig(objects["DaemonSet"][0], "spec", "template", "spec")
	if named(objects["ConfigMap"], "r-gpu-mem-breakdown-rules") != nil || byName(dig(pod, "volumes"), "breakdown-rules") != nil ||
		strings.Contains(strings.Join(toStrings(dig(pod, "containers", 0, "args")), " "), "--breakdown-rules") {
		t.Errorf("without rules: %v", pod)
	}
}

// byName is the entry of a list (a pod's volumes, a container's mounts)
// with this name, nil if none.
func byName(list any, name string) map[string]any {
	l, _ := list.([]any)
	for _, o := range l {
		if m, ok := o.(map[string]any); ok && m["name"] == name {
			return m
		}
	}
	return nil
}

// TestChartState (issue 56, point 2): the agent's state is on by default,
// its journal in a directory of the host and its pins on the host's BPF
// file system, one agent a node at a time in a rollout (the old one stops
// before the new one starts), with a grace period to finish; off, none of
// it.
func TestChartState(t *testing.T) {
	ds := render(t, nil)["DaemonSet"][0]
	pod := dig(ds, "spec", "template", "spec")
	args := strings.Join(toStrings(dig(pod, "containers", 0, "args")), " ")
	if !strings.Contains(args, "--state-dir=/var/lib/gpu-mem --pin-path=/sys/fs/bpf/gpu-mem") {
		t.Errorf("args %s", args)
	}
	volumes := dig(pod, "volumes")
	if dig(byName(volumes, "state"), "hostPath", "path") != "/var/lib/gpu-mem" || dig(byName(volumes, "bpffs"), "hostPath", "path") != "/sys/fs/bpf" ||
		dig(byName(volumes, "bpffs"), "hostPath", "type") != "Directory" {
		t.Errorf("volumes %v", volumes)
	}
	mounts := dig(pod, "containers", 0, "volumeMounts")
	if dig(byName(mounts, "state"), "mountPath") != "/var/lib/gpu-mem" || dig(byName(mounts, "bpffs"), "mountPath") != "/sys/fs/bpf" {
		t.Errorf("mounts %v", mounts)
	}
	if s := dig(ds, "spec", "updateStrategy", "rollingUpdate"); dig(s, "maxSurge") != float64(0) && dig(s, "maxSurge") != 0 || dig(s, "maxUnavailable") == nil {
		t.Errorf("update strategy %v", dig(ds, "spec", "updateStrategy"))
	}
	if g := dig(pod, "terminationGracePeriodSeconds"); g != float64(30) && g != 30 {
		t.Errorf("grace period %v", g)
	}

	pod = dig(render(t, map[string]any{"state": map[string]any{"enabled": false}})["DaemonSet"][0], "spec", "template", "spec")
	if args := strings.Join(toStrings(dig(pod, "containers", 0, "args")), " "); strings.Contains(args, "--state-dir") || dig(pod, "volumes") != nil {
		t.Errorf("state off: %v", pod)
	}
}
