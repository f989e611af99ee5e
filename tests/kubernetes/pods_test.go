package kubernetes

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/tests/cgrouptest"
	"github.com/gpu-mem/gpu-mem/tests/chartrender"
)

var root, _ = filepath.Abs("../..")

const containerID = "7c0ffee07c0ffee07c0ffee07c0ffee07c0ffee07c0ffee07c0ffee07c0ffee0"

// trainerPod creates namespace ml and in it a pod of a Deployment's
// ReplicaSet on node-1, with its container running, as kubelet would
// report it.
func trainerPod(t *testing.T, c *cluster) *corev1.Pod {
	namespace(t, c, "ml")
	return replicaPod(t, c, "ml", "trainer", "5d9f8", "x2x7z", containerID)
}

// namespace creates a namespace with its default service account.
func namespace(t *testing.T, c *cluster, name string) {
	ctx := context.Background()
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller manager runs to make the namespace's default account.
	if _, err := c.client.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// replicaPod creates pod APP-HASH-SUFFIX of Deployment app's ReplicaSet
// APP-HASH on node-1, its one container (named app) running as cid.
func replicaPod(t *testing.T, c *cluster, ns, app, hash, suffix, cid string) *corev1.Pod {
	ctx := context.Background()
	yes := true
	pod, err := c.client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: app + "-" + hash + "-" + suffix, Labels: map[string]string{"app": app, "pod-template-hash": hash},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app + "-" + hash, UID: types.UID("0f0f0f0f-0000-4000-8000-" + cid[:12]), Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: app, Image: app + ":1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: app, Image: app + ":1", ImageID: app + "@sha256:00", Ready: true,
		ContainerID: "containerd://" + cid, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	if pod, err = c.client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return pod
}

// process is a started command whose stderr lines are watched: gpumem's,
// logged in JSON (the agent's, startAgentFirst), are read as their
// sentences and events.
type process struct {
	cmd   *exec.Cmd
	lines chan string
	stdin io.WriteCloser
	out   *bufio.Scanner

	mu     sync.Mutex
	log    []string    // every line of stderr so far, gpumem's as their sentences
	events []logs.Line // gpumem's events so far
}

// said is every line of stderr so far.
func (p *process) said() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.log)
}

func start(t *testing.T, env []string, name string, args ...string) *process {
	p := &process{cmd: exec.Command(name, args...), lines: make(chan string, 1000)}
	p.cmd.Env = append(os.Environ(), env...)
	stdin, _ := p.cmd.StdinPipe()
	stdout, _ := p.cmd.StdoutPipe()
	stderr, _ := p.cmd.StderrPipe()
	p.stdin, p.out = stdin, bufio.NewScanner(stdout)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Log(sc.Text())
			line := logs.Line{Msg: sc.Text()}
			if strings.HasPrefix(sc.Text(), `{"time":`) {
				var err error
				if line, err = logs.Parse(sc.Text()); err != nil {
					t.Error(err)
				}
			}
			p.mu.Lock()
			p.log = append(p.log, line.Msg)
			if line.Event != "" {
				p.events = append(p.events, line)
			}
			p.mu.Unlock()
			p.lines <- line.Msg
		}
		close(p.lines)
	}()
	t.Cleanup(func() { p.cmd.Process.Kill(); p.cmd.Wait() })
	return p
}

func (p *process) waitLine(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(hangLimit)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				t.Fatalf("ended before saying %q", prefix)
			}
			if _, v, found := strings.Cut(line, prefix); found {
				return v
			}
		case <-timeout:
			t.Fatalf("did not say %q", prefix)
		}
	}
}

// agentDriver is an agent's own copy of the simulated driver: a private
// inode, which only the workloads started with its env load, so that the
// processes of other tests, of other packages or of another run of the
// suite never reach that agent's driver view. (tests/agent_test.go has the
// same; this package cannot import that one.)
type agentDriver struct {
	path  string   // the copy, the agent's --library
	env   []string // for simwork: the copy's folder, searched before its RUNPATH
	pyEnv []string // for simwork.py: the copy, as SIMCUDA_LIB
}

// startAgentFirst starts the agent, `launch("agent", "--library", COPY,
// args...)`, as a DaemonSet starts it, before any GPU process, on a copy of
// the simulated driver, and waits until it has logged intervals status
// lines counting no process, a status line every 200ms unless args say
// otherwise. With --tensors=false every status line before
// must count none; with the tensor view, a line may count another
// package's process (the allocator probes attach to the shared simulated
// allocator in any process that maps it) and is then not counted.
func startAgentFirst(t *testing.T, intervals int, launch func(args ...string) *process, args ...string) (*process, agentDriver) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "driver")
	d := agentDriver{path: filepath.Join(dir, "libcuda.so.1")}
	data, err := os.ReadFile(filepath.Join(root, "build/sim/libcuda.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	d.env = []string{"LD_LIBRARY_PATH=" + dir}
	d.pyEnv = []string{"SIMCUDA_LIB=" + d.path}
	agent := launch(append([]string{"--log-format=json", "agent", "--library", d.path, "--status-interval", "200ms"}, args...)...)
	agent.waitEvent(t, logs.Attached, "library", d.path)
	tensors := !slices.Contains(args, "--tensors=false")
	for idle := 0; idle < intervals; {
		line := agent.waitLine(t, "status: ")
		switch {
		case strings.HasPrefix(line, "0 processes"):
			idle++
		case !tensors:
			t.Fatalf("status before any process: %q", line)
		}
	}
	return agent, d
}

// waitEvent waits for the event name whose fields hold wants (key-value
// pairs), logged before the call or after, and returns its fields.
func (p *process) waitEvent(t *testing.T, name string, wants ...any) map[string]any {
	t.Helper()
	return waitfor.Value(t, fmt.Sprintf("event %s %v", name, wants), hangLimit, func() map[string]any {
		p.mu.Lock()
		defer p.mu.Unlock()
		if i := slices.IndexFunc(p.events, func(l logs.Line) bool { return l.Is(name, wants...) }); i >= 0 {
			return p.events[i].Fields
		}
		return nil
	}, func(fields map[string]any) bool { return fields != nil })
}

// metricsURL waits for the agent's metrics endpoint and returns its URL.
func (p *process) metricsURL(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("http://%s/metrics", p.waitEvent(t, logs.ServingMetrics)["address"])
}

// waitSeries waits for a pushed series that ok accepts, and returns the
// latest one.
func waitSeries(t *testing.T, r *pyroscopetest.Receiver, ok func(*pushv1.RawProfileSeries) bool, what string) *pushv1.RawProfileSeries {
	t.Helper()
	var found *pushv1.RawProfileSeries
	waitfor.Condition(t, what, hangLimit, func() bool {
		pushes := r.Received()
		for i := len(pushes) - 1; i >= 0; i-- {
			if j := slices.IndexFunc(pushes[i].Series, ok); j >= 0 {
				found = pushes[i].Series[j]
				return true
			}
		}
		return false
	})
	return found
}

func liveSeries(t *testing.T, url string) []*dto.Metric {
	return metricstest.Scrape(t, url)["gpumem_live_bytes"].GetMetric()
}

// TestPodNamesFromTheAPIServer: a process in a pod's cgroup is named from
// the API server; deleting the pod clears the names; stopping the API
// server keeps tracing, with what the cgroup says.
func TestPodNamesFromTheAPIServer(t *testing.T) {
	c := startCluster(t)
	pod := trainerPod(t, c)

	receiver, addr := pyroscopetest.Loopback(t)
	// The agent first, as a DaemonSet, on its own driver (the one series
	// below is of its processes only). Without the tensor view: another
	// package's process on the simulated allocator would count in its
	// status lines.
	agent, driver := startAgentFirst(t, 3, func(args ...string) *process {
		return start(t, nil, filepath.Join(root, "bin/gpumem"), args...)
	}, "--tensors=false", "--kubeconfig", c.kubeconfig, "--node-name", "node-1", "--metrics-address", "127.0.0.1:0",
		"--pyroscope-interval", "200ms", "--pyroscope-url", "http://"+addr)
	url := agent.metricsURL(t)

	// Into the pod's cgroup at "ready", before its first allocation, the
	// agent's first event of it.
	w := start(t, driver.env, filepath.Join(root, "build/sim/simwork"), "hold", "4096")
	if !w.out.Scan() || !strings.HasPrefix(w.out.Text(), "ready ") {
		t.Fatal("workload did not start")
	}
	pid := w.cmd.Process.Pid
	cgrouptest.InContainer(t, pid, string(pod.UID), containerID)
	fmt.Fprintln(w.stdin)
	if !w.out.Scan() || w.out.Text() != "done" {
		t.Fatal("workload did not allocate")
	}

	want := map[string]string{"namespace": "ml", "pod": "trainer-5d9f8-x2x7z", "container": "trainer",
		"pod_uid": string(pod.UID), "container_id": containerID}
	waitLabels(t, url, func(l map[string]string) bool {
		for k, v := range want {
			if l[k] != v {
				return false
			}
		}
		return true
	}, "the pod's names")
	last := waitSeries(t, receiver, func(s *pushv1.RawProfileSeries) bool {
		return pyroscopetest.Labels(s)["service_name"] == "ml/trainer"
	}, "a push with the pod's names")
	if l := pyroscopetest.Labels(last); l["service_name"] != "ml/trainer" || l["namespace"] != "ml" || l["pod"] != "trainer-5d9f8-x2x7z" || l["container"] != "trainer" {
		t.Errorf("Pyroscope labels %v", l)
	}
	prof, err := profile.ParseData(last.Samples[0].RawProfile)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		if got := prof.Sample[0].Label[k]; len(got) != 1 || got[0] != v {
			t.Errorf("pprof label %s=%v, want %s", k, got, v)
		}
	}

	if err := c.client.CoreV1().Pods("ml").Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitLabels(t, url, func(l map[string]string) bool {
		return l["namespace"] == "" && l["pod"] == "" && l["pod_uid"] == string(pod.UID)
	}, "the names cleared, the UID kept")

	c.apiserver.Process.Kill()
	c.apiserver.Wait()
	agent.waitLine(t, "status:")
	agent.waitLine(t, "status:")
	if series := liveSeries(t, url); len(series) != 1 || series[0].GetGauge().GetValue() != 4096 || metricstest.Labels(series[0])["pod_uid"] != string(pod.UID) {
		t.Errorf("after the API server stopped: %v", series)
	}
}

func waitLabels(t *testing.T, url string, ok func(map[string]string) bool, what string) {
	t.Helper()
	waitfor.Value(t, "metric with "+what, hangLimit, func() []*dto.Metric { return liveSeries(t, url) },
		func(series []*dto.Metric) bool { return len(series) == 1 && ok(metricstest.Labels(series[0])) })
}

// TestChartServerSideDryRun: every object the chart renders, with every
// option but the ServiceMonitor (its CRD is not installed), is accepted by
// the API server in a server-side dry run.
func TestChartServerSideDryRun(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	objects, err := chartrender.Render(root, "gpu", map[string]any{
		"pyroscope":    map[string]any{"url": "http://pyroscope:4040", "existingSecret": "pyro"},
		"azureMonitor": map[string]any{"enabled": true},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resources := map[string]schema.GroupVersionResource{
		"DaemonSet": {Group: "apps", Version: "v1", Resource: "daemonsets"}, "ServiceAccount": {Version: "v1", Resource: "serviceaccounts"},
		"ClusterRole":        {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
		"ClusterRoleBinding": {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
		"Service":            {Version: "v1", Resource: "services"}, "ConfigMap": {Version: "v1", Resource: "configmaps"},
	}
	for _, obj := range objects {
		u := &unstructured.Unstructured{Object: obj}
		gvr, ok := resources[u.GetKind()]
		if !ok {
			t.Fatalf("no resource for %s", u.GetKind())
		}
		var ri dynamic.ResourceInterface = dyn.Resource(gvr)
		if ns := u.GetNamespace(); ns != "" {
			ri = dyn.Resource(gvr).Namespace(ns)
		}
		if _, err := ri.Create(ctx, u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	if len(objects) != 7 { // the Azure Monitor and dashboard ConfigMaps among them
		t.Errorf("%d objects", len(objects))
	}
}
