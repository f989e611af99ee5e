package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	"google.golang.org/grpc"
)

// agentFootprint runs `gpumem agent` against workloads and reads its CPU
// time and peak resident memory from /proc: the lean build, which the agent
// image ships.
func agentFootprint() string {
	seconds := 5.0
	stacks := []int{10_000, 100_000}
	if *smoke {
		seconds, stacks = 1, []int{1000}
	}
	var b strings.Builder
	b.WriteString("`gpumem agent --pyroscope-interval 1s --status-interval 1s` (no server: status lines only, unless pushed) while a workload runs, from\n")
	b.WriteString("the agent image's build (`bin/gpumem-lean`: `-tags lean`, static);\n")
	b.WriteString("CPU is the time the agent's threads ran (their schedstat) over the wall time, peak RSS its VmHWM.\n\n")
	b.WriteString("| workload | agent CPU | agent peak RSS |\n| --- | ---: | ---: |\n")
	var slowRSS, worst, worstCPU float64
	for _, rate := range []int{1000, 10_000} {
		cpu, rss := underAgent(func() {
			runWorkload(nil, simwork, "threads", "1", fmt.Sprint(seconds), fmt.Sprint(rate/2))
		})
		if rate == 1000 {
			slowRSS = rss
		}
		fmt.Fprintf(&b, "| %d events/s for %.0f s | %.1f%% | %.1f MiB |\n", rate, seconds, cpu, rss)
	}
	for _, n := range stacks {
		cpu, rss := underAgent(func() {
			runWorkload([]string{"SIMWORK_LINGER_MS=2500"}, simwork, "stacks", strconv.Itoa(n))
		})
		worst, worstCPU = max(worst, rss), max(worstCPU, cpu)
		fmt.Fprintf(&b, "| %d distinct stacks held live | %.1f%% | %.1f MiB |\n", n, cpu, rss)
	}
	// The same with a Pyroscope server: every interval, a profile of every
	// stack is built and pushed.
	server := pyroscopeServer()
	defer server.Stop()
	var pushedRSS, pushedCPU float64
	for _, n := range stacks {
		cpu, rss := underAgent(func() {
			runWorkload([]string{"SIMWORK_LINGER_MS=2500"}, simwork, "stacks", strconv.Itoa(n))
		}, "--pyroscope-url", "http://"+server.addr)
		pushedRSS, pushedCPU = max(pushedRSS, rss), max(pushedCPU, cpu)
		fmt.Fprintf(&b, "| %d distinct stacks held live, pushed to Pyroscope | %.1f%% | %.1f MiB |\n", n, cpu, rss)
	}
	fmt.Fprintf(&b, "\nTargets: peak RSS at most 60 MiB at 1000 events/s: %s (%.1f MiB); at most 150 MiB with 100k live stacks: %s (%.1f MiB at the largest),\n",
		verdict(slowRSS <= 60), slowRSS, verdict(worst <= 150), worst)
	fmt.Fprintf(&b, "%s when pushed to Pyroscope (%.1f MiB); CPU with 100k live stacks well under one core (at most 50%%): %s (%.1f%% at the largest), %s when pushed (%.1f%%).\n",
		verdict(pushedRSS <= 150), pushedRSS, verdict(worstCPU <= 50), worstCPU, verdict(pushedCPU <= 50), pushedCPU)
	return b.String()
}

// startAgent starts the lean agent on the simulated driver with args, and
// returns once it has attached; its log is read and dropped.
func startAgent(args ...string) *exec.Cmd {
	return startAgentUntil("attached to", append([]string{"--library", simLib}, args...)...)
}

// startAgentUntil starts the lean agent with args, and returns once its
// log said ready.
func startAgentUntil(ready string, args ...string) *exec.Cmd {
	agent := exec.Command(lean, append([]string{"agent"}, args...)...)
	stderr, err := agent.StderrPipe()
	check(err)
	check(agent.Start())
	sc := bufio.NewScanner(stderr)
	for sc.Scan() && !strings.Contains(sc.Text(), ready) {
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return agent
}

// underAgent runs work with an agent tracing it, and returns the agent's
// CPU percentage over the run and its peak RSS in MiB.
func underAgent(work func(), args ...string) (float64, float64) {
	agent := startAgent(append([]string{"--pyroscope-interval", "1s", "--status-interval", "1s"}, args...)...)
	cpu0 := cpuTime(agent.Process.Pid)
	start := time.Now()
	work()
	time.Sleep(1500 * time.Millisecond) // an interval after the work: the report of it
	cpu := coreShare(cpuTime(agent.Process.Pid)-cpu0, time.Since(start))
	rss := peakRSS(agent.Process.Pid)
	agent.Process.Signal(os.Interrupt)
	agent.Wait()
	return cpu, rss
}

// cpuTicks is utime+stime of a process, in clock ticks (100 per second).
// cpuTime is the time process pid's threads ran, in nanoseconds, from each
// thread's schedstat: /proc/PID/stat's utime and stime come in ticks of
// 10 ms, a third of an idle agent's 30 s at 0.1%. A thread that exited
// takes its time with it; the Go runtime keeps its threads.
func cpuTime(pid int) time.Duration {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	check(err)
	var ns time.Duration
	for _, task := range tasks {
		data, err := os.ReadFile(task)
		if err != nil {
			continue // a thread gone since the listing
		}
		v, err := strconv.ParseInt(strings.Fields(string(data))[0], 10, 64)
		check(err)
		ns += time.Duration(v)
	}
	return ns
}

// coreShare is CPU time over wall time, in % of a core.
func coreShare(cpu, wall time.Duration) float64 { return 100 * cpu.Seconds() / wall.Seconds() }

func peakRSS(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	check(err)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kib, _ := strconv.Atoi(strings.Fields(v)[0])
			return float64(kib) / 1024
		}
	}
	return 0
}

// discardServer is a Pyroscope push endpoint that accepts and drops
// every push.
type discardServer struct {
	pushv1.UnimplementedPusherServiceServer
	addr   string
	server *grpc.Server
}

func (*discardServer) Push(context.Context, *pushv1.PushRequest) (*pushv1.PushResponse, error) {
	return &pushv1.PushResponse{}, nil
}

func pyroscopeServer() *discardServer {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	s := &discardServer{addr: lis.Addr().String(), server: grpc.NewServer(grpc.MaxRecvMsgSize(1 << 30))}
	pushv1.RegisterPusherServiceServer(s.server, s)
	go s.server.Serve(lis)
	return s
}

func (s *discardServer) Stop() { s.server.Stop() }
