package kubernetes

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/tests/cgrouptest"
	"github.com/gpu-mem/gpu-mem/tests/podsecurity"
)

// TestAgentWithTheChartsPrivileges: the agent run as the chart's
// DaemonSet runs it (root with the capabilities the chart adds and no
// other, in every set; no_new_privs; a read-only root file system;
// containerd's RuntimeDefault seccomp filter), its sets read back from
// /proc. It attaches to the driver of a Python
// process in a pod's cgroup, reads its Python frames and its tensors
// (the allocator's USDT probes), and names its pod from the API server:
// on its metrics and in its pushes to Pyroscope, exactly. It says no
// capability is missing.
func TestAgentWithTheChartsPrivileges(t *testing.T) {
	sc, err := podsecurity.FromChart(root)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Privileged || sc.AllowPrivilegeEscalation || !sc.ReadOnlyRootFilesystem || sc.Seccomp != "RuntimeDefault" {
		t.Fatalf("the chart's securityContext: %+v", sc)
	}
	want, err := podsecurity.Mask(sc.Add)
	if err != nil {
		t.Fatal(err)
	}

	c := startCluster(t)
	pod := trainerPod(t, c)
	receiver, addr := pyroscopetest.Loopback(t)
	// The agent first, as a DaemonSet, on its own driver (the one driver
	// series below is of its processes only; its tensor view traces any
	// process on the shared simulated allocator: every tensor check is of
	// the workload's pid).
	agent, driver := startAgentFirst(t, 3, func(args ...string) *process { return startAs(t, sc, args...) },
		"--tensors", "--kubeconfig", c.kubeconfig, "--node-name", "node-1",
		"--metrics-address", "127.0.0.1:0", "--pyroscope-interval", "200ms", "--pyroscope-url", "http://"+addr)
	url := agent.metricsURL(t)
	// Into the pod's cgroup at "ready", before its first allocation, the
	// agent's first event of it.
	w := startPython(t, driver.pyEnv)
	cgrouptest.InContainer(t, w.cmd.Process.Pid, string(pod.UID), containerID)
	pid := w.cmd.Process.Pid
	agent.waitEvent(t, logs.Python, "pid", pid, "version", "3.12")
	agent.waitEvent(t, logs.Attached, "kind", "driver", "probes", 32)
	agent.waitEvent(t, logs.Attached, "kind", "allocator", "probes", 2)

	// What the kernel holds for the agent: the chart's capabilities, in
	// the bounding, permitted and effective sets, and nothing to pass on.
	status, err := podsecurity.Status(agent.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	for set, mask := range map[string]uint64{"CapBnd": want, "CapPrm": want, "CapEff": want, "CapInh": 0, "CapAmb": 0} {
		if got, err := podsecurity.Set(status, set); err != nil || got != mask {
			t.Errorf("%s %016x (%v), want %016x (%s)", set, got, err, mask, strings.Join(sc.Add, ", "))
		}
	}
	t.Logf("agent: CapBnd %s CapPrm %s CapEff %s CapInh %s CapAmb %s NoNewPrivs %s Seccomp %s", status["CapBnd"], status["CapPrm"],
		status["CapEff"], status["CapInh"], status["CapAmb"], status["NoNewPrivs"], status["Seccomp"])
	// Seccomp 2: a filter (containerd's RuntimeDefault for these
	// capabilities), one only.
	if status["NoNewPrivs"] != "1" || status["Seccomp"] != "2" || status["Seccomp_filters"] != "1" || status["Name"] != "gpumem" {
		t.Errorf("agent %s: NoNewPrivs %s, Seccomp %s, %s filters", status["Name"], status["NoNewPrivs"], status["Seccomp"], status["Seccomp_filters"])
	}

	expect := w.runPython(t)
	tensors := expect["tensor_load_weights"] + expect["tensor_kv_cache"] + expect["tensor_activations"]
	names := map[string]string{"namespace": "ml", "pod": "trainer-5d9f8-x2x7z", "container": "trainer", "pod_uid": string(pod.UID)}
	families := metricstest.ScrapeUntil(t, url, hangLimit, func(f map[string]*dto.MetricFamily) bool {
		return namedLive(f["gpumem_tensor_live_bytes"], pid, names) == tensors && namedLive(f["gpumem_live_bytes"], pid, names) == 36<<20
	})
	if n := len(families["gpumem_live_bytes"].GetMetric()); n != 1 {
		t.Errorf("%d driver series, want 1", n)
	}

	// In Pyroscope: the tensors by the Python function that asked for them.
	byFunction := func() map[string]int64 {
		for i := len(receiver.Received()) - 1; i >= 0; i-- {
			for _, s := range receiver.Received()[i].Series {
				if l := pyroscopetest.Labels(s); l["pid"] == strconv.Itoa(pid) && l["kind"] == "tensor" && l["pod"] == names["pod"] {
					return liveByPythonFunction(t, s.Samples[0].RawProfile, "tensor_inuse_space", "load_weights", "kv_cache", "activations")
				}
			}
		}
		return nil
	}
	wantFunctions := map[string]int64{"load_weights": int64(expect["tensor_load_weights"]), "kv_cache": int64(expect["tensor_kv_cache"]),
		"activations": int64(expect["tensor_activations"])}
	waitfor.Value(t, fmt.Sprintf("tensors pushed by Python function %v", wantFunctions), hangLimit, byFunction,
		func(got map[string]int64) bool { return maps.Equal(got, wantFunctions) })
	for _, err := range receiver.Refused() {
		t.Errorf("receiver refused: %v", err)
	}
	agent.stop(t)
	for _, line := range agent.said() {
		if strings.Contains(line, "without CAP_") {
			t.Errorf("with the chart's capabilities: %s", line)
		}
	}
}

// namedLive is the value of pid's series of family whose labels include
// names; 0 without one.
func namedLive(family *dto.MetricFamily, pid int, names map[string]string) uint64 {
	for _, m := range family.GetMetric() {
		l := metricstest.Labels(m)
		named := l["pid"] == strconv.Itoa(pid)
		for k, v := range names {
			named = named && l[k] == v
		}
		if named {
			return uint64(m.GetGauge().GetValue())
		}
	}
	return 0
}

// liveByPythonFunction sums the values of sample type inuse (the live
// bytes of a view) of a pushed profile by the first of functions on each
// stack.
func liveByPythonFunction(t *testing.T, raw []byte, inuse string, functions ...string) map[string]int64 {
	t.Helper()
	p, at := parseProfile(t, raw, inuse)
	live := map[string]int64{}
	for _, s := range p.Sample {
		for _, loc := range s.Location {
			if fn := loc.Line[0].Function.Name; slices.Contains(functions, fn) {
				live[fn] += s.Value[at]
				break
			}
		}
	}
	return live
}

// parseProfile reads a pushed profile, and where its values of sample type
// typ are.
func parseProfile(t *testing.T, raw []byte, typ string) (*profile.Profile, int) {
	t.Helper()
	p, err := profile.ParseData(raw)
	if err != nil {
		t.Fatal(err)
	}
	at := slices.IndexFunc(p.SampleType, func(st *profile.ValueType) bool { return st.Type == typ })
	if at < 0 {
		t.Fatalf("a profile without %s: %v", typ, p.SampleType)
	}
	return p, at
}

// startPython starts simwork.py's tensor scenario under CPython 3.12 with
// the simulated PyTorch allocator and the driver env says (SIMCUDA_LIB).
func startPython(t *testing.T, env []string) *process {
	w := start(t, append([]string{"SIMTORCH_LIB=" + filepath.Join(root, "build/sim/libc10_cuda.so")}, env...),
		"/root/.pyenv/versions/3.12.1/bin/python3.12", filepath.Join(root, "tests/workloads/simwork.py"), "tensors")
	if !w.out.Scan() || !strings.HasPrefix(w.out.Text(), "ready ") {
		t.Fatal("workload did not start")
	}
	return w
}

// runPython runs the scenario and returns its expect values.
func (p *process) runPython(t *testing.T) map[string]uint64 {
	t.Helper()
	fmt.Fprintln(p.stdin)
	if !p.out.Scan() || p.out.Text() != "done" {
		t.Fatal("workload did not run")
	}
	if !p.out.Scan() || !strings.HasPrefix(p.out.Text(), "expect ") {
		t.Fatal("workload said no expect line")
	}
	expect := map[string]uint64{}
	for _, kv := range strings.Fields(strings.TrimPrefix(p.out.Text(), "expect ")) {
		k, v, _ := strings.Cut(kv, "=")
		expect[k], _ = strconv.ParseUint(v, 10, 64)
	}
	return expect
}

// startAs starts gpumem with args under the securityContext sc.
func startAs(t *testing.T, sc podsecurity.Context, args ...string) *process {
	t.Helper()
	cmd, err := sc.Command(filepath.Join(root, "bin/gpumem"), args...)
	if err != nil {
		t.Fatal(err)
	}
	return start(t, cmd.Env, cmd.Path, cmd.Args[1:]...)
}

// waitSaid waits until the process has said a line containing each of
// wants, in any order.
func (p *process) waitSaid(t *testing.T, wants ...string) {
	t.Helper()
	waitfor.Value(t, fmt.Sprintf("line saying each of %q", wants), hangLimit, func() []string {
		return slices.DeleteFunc(slices.Clone(wants), func(want string) bool {
			return slices.ContainsFunc(p.said(), func(line string) bool { return strings.Contains(line, want) })
		})
	}, func(missing []string) bool { return len(missing) == 0 })
}

// saidTimes is every line so far that contains want.
func (p *process) saidTimes(want string) []string {
	return slices.DeleteFunc(p.said(), func(line string) bool { return !strings.Contains(line, want) })
}

// waitSaidTimes waits until the process has said n lines containing want.
func (p *process) waitSaidTimes(t *testing.T, want string, n int) {
	t.Helper()
	waitfor.Value(t, fmt.Sprintf("%d lines saying %q", n, want), hangLimit, func() int { return len(p.saidTimes(want)) },
		func(said int) bool { return said >= n })
}

// stop interrupts the process and waits for it and its last lines.
func (p *process) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(os.Interrupt)
	for range p.lines {
	}
	if err := p.cmd.Wait(); err != nil {
		t.Errorf("%s: %v", p.cmd.Path, err)
	}
}
