package kubernetes

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/tests/cgrouptest"
)

// TestAPIServerGoneAndBack (issue 21, point 3; docs/faults.md): the real
// kube-apiserver stopped under a running agent, then started again on
// the same etcd. The agent says the loss once and the return once; tracing
// goes on meanwhile; a pod created once the server is back, while the
// agent's watch still waits out its backoff, is named.
func TestAPIServerGoneAndBack(t *testing.T) {
	c := startCluster(t)
	agent, driver := startAgentFirst(t, 2, func(args ...string) *process {
		return start(t, nil, filepath.Join(root, "bin/gpumem"), args...)
	}, "--tensors=false", "--kubeconfig", c.kubeconfig, "--node-name", "node-1", "--metrics-address", "127.0.0.1:0",
		"--pyroscope-interval", "200ms")
	metrics := agent.metricsURL(t)

	c.apiserver.Process.Kill()
	c.apiserver.Wait()
	agent.waitSaid(t, "pods: the API server: ")
	// Tracing goes on without it: a process allocates and is counted.
	w := start(t, driver.env, filepath.Join(root, "build/sim/simwork"), "hold", "4096")
	if !w.out.Scan() || !strings.HasPrefix(w.out.Text(), "ready ") {
		t.Fatal("workload did not start")
	}
	pid := w.cmd.Process.Pid

	// Back: the same command line, the same etcd.
	restarted := exec.Command(c.apiserver.Path, c.apiserver.Args[1:]...)
	log, err := os.OpenFile(filepath.Join(c.dir, "kube-apiserver.log"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	restarted.Stdout, restarted.Stderr = log, log
	if err := restarted.Start(); err != nil {
		t.Fatal(err)
	}
	c.apiserver = restarted // stopped by the cluster's cleanup
	server, err := url.Parse(c.client.CoreV1().RESTClient().Get().URL().String())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(server.Port())
	c.waitReady(t, port)

	pod := trainerPod(t, c)
	cgrouptest.InContainer(t, pid, string(pod.UID), containerID)
	fmt.Fprintln(w.stdin)
	if !w.out.Scan() || w.out.Text() != "done" {
		t.Fatal("workload did not allocate")
	}
	waitLabels(t, metrics, func(l map[string]string) bool {
		return l["namespace"] == "ml" && l["pod"] == "trainer-5d9f8-x2x7z" && l["container"] == "trainer" && l["pod_uid"] == string(pod.UID)
	}, "the names of the pod created after the return")
	agent.waitSaid(t, "pods: the API server answers again: ")
	if series := liveSeries(t, metrics); len(series) != 1 || series[0].GetGauge().GetValue() != 4096 {
		t.Errorf("live %v", series)
	}
	lost, back := 0, 0
	for _, line := range agent.said() {
		if strings.Contains(line, "pods: the API server: ") {
			lost++
		}
		if strings.Contains(line, "pods: the API server answers again: ") {
			back++
		}
	}
	if lost != 1 || back != 1 {
		t.Errorf("the loss said %d times, the return %d, want once each", lost, back)
	}
}
