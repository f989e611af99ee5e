package tests

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/gpu-mem/gpu-mem/operators/pyroscope/pyroscopetest"
)

// TestAgentPushesToPyroscope: gpumem agent profiles the workload and pushes
// to a real PusherService; the pushed profiles carry exactly the tracer's
// per-stack bytes, the four sample types, __delta__="false" and the labels.
func TestAgentPushesToPyroscope(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &pyroscopetest.Receiver{}
	pyroscopetest.Serve(t, r, lis)

	w := startWorkload(t, nil, simwork, "kinds")
	c := startCLI(t, "agent", "--pid", strconv.Itoa(w.pid), "--pyroscope-url", "http://"+lis.Addr().String(),
		"--pyroscope-interval", "500ms", "--node", "node-7")
	c.waitStderr("attached to")
	w.run()
	c.waitStderr("status: 1 processes")
	time.Sleep(time.Second) // an interval that begins after the workload's last call
	pushes := r.Received()
	if len(pushes) < 2 {
		t.Fatalf("%d pushes", len(pushes))
	}

	allocated := map[string]int64{}
	var last map[string]int64
	for _, req := range pushes {
		inuse := map[string]int64{}
		for _, series := range req.Series {
			labels := pyroscopetest.Labels(series)
			want := map[string]string{"__name__": "memory", "__delta__": "false", "service_name": "simwork",
				"pid": strconv.Itoa(w.pid), "comm": "simwork", "node": "node-7"}
			for k, v := range want {
				if labels[k] != v {
					t.Fatalf("label %s=%q, want %q (all: %v)", k, labels[k], v, labels)
				}
			}
			p, err := profile.ParseData(series.Samples[0].RawProfile)
			if err != nil {
				t.Fatal(err)
			}
			types := []string{}
			for _, st := range p.SampleType {
				types = append(types, st.Type)
			}
			if strings.Join(types, ",") != "alloc_objects,alloc_space,inuse_objects,inuse_space" {
				t.Fatalf("sample types %v", types)
			}
			for _, s := range p.Sample {
				fn := s.Location[1].Line[0].Function.Name
				allocated[fn] += s.Value[1]
				inuse[fn] += s.Value[3]
				if s.Label["kind"][0] != labels["kind"] {
					t.Errorf("sample kind %v in series %v", s.Label["kind"], labels["kind"])
				}
			}
		}
		if len(req.Series) > 0 {
			last = inuse
		}
	}
	// Allocated: summed over intervals. Live: at the last interval's end.
	for fn, want := range map[string][2]int64{
		"alloc_device": {3 << 20, 2 << 20}, "alloc_vmm": {6 << 20, 4 << 20},
		"alloc_async": {2*65536 + 32768 + 131072, 65536 + 131072}, "alloc_host": {4096 + 8192, 4096},
	} {
		if allocated[fn] != want[0] || last[fn] != want[1] {
			t.Errorf("%s: allocated %d live %d, want %d and %d", fn, allocated[fn], last[fn], want[0], want[1])
		}
	}
	c.interrupt()
	w.exit()
}

// TestAgentWhileReceiverIsDown: nothing listens at the URL. Tracing goes on,
// the status line says what fails, full-queue drops are counted, and the
// agent's memory stays bounded.
func TestAgentWhileReceiverIsDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()

	w := startWorkload(t, nil, simwork, "threads", "4", "5", "2000")
	c := startCLI(t, "agent", "--pid", strconv.Itoa(w.pid), "--pyroscope-url", "http://"+addr,
		"--pyroscope-interval", "200ms", "--pyroscope-queue", "3")
	c.waitStderr("attached to")
	w.run()
	var status string
	for range 3 {
		c.waitStderr("status:")
	}
	rss := residentKiB(t, c.cmd.Process.Pid)
	timeout := time.After(10 * time.Second)
	for !strings.Contains(status, "dropped") || strings.Contains(status, " 0 dropped") {
		select {
		case status = <-c.lines:
		case <-timeout:
			t.Fatalf("no drops reported; last status %q", status)
		}
	}
	if !strings.Contains(status, "0 done") || !strings.Contains(status, "last error:") || !strings.Contains(status, "3 queued") {
		t.Errorf("status %q", status)
	}
	if rss > 150<<10 {
		t.Errorf("agent resident memory %d KiB", rss)
	}
	c.interrupt()
	w.exit()
}

func residentKiB(t *testing.T, pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
