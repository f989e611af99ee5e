package main

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// idleCost measures the agent as a node runs it, while no process calls
// a driver: started as the chart starts it (every driver library found by
// scanning the host's own /proc, in the host's PID namespace; its metrics
// served), after sleep processes a minute old (as a node's mostly are),
// while more start, one every idleChurn (a node's probes, shells and
// jobs). Its CPU over each of idleWindows windows, in % of a core: on a
// virtual machine, one window's figure moves by a fifth from one run to the
// next, so the median is the figure, and the range is shown beside it.
func idleCost() string {
	counts, age, window, settle := []int{1000, 100}, time.Minute, 30*time.Second, 5*time.Second
	if *smoke {
		counts, age, window, settle = []int{100, 10}, time.Second, time.Second, time.Second
	}
	idle := startIdle(counts[0])
	defer idle.stop()
	time.Sleep(age - time.Since(idle.started))
	var b strings.Builder
	fmt.Fprintf(&b, "The idle agent (`bin/gpumem-lean agent --metrics-address 127.0.0.1:0`: no --library, so it scans for driver\n"+
		"libraries) in the host's PID namespace, started after idle processes (`sleep`, a minute old) while one more starts\n"+
		"every %v; no process calls a driver. CPU: the time its threads ran (their schedstat) over %v of wall time, after %v for its first scan;\n"+
		"the median of %d such windows in a row, and their range.\n\n",
		idleChurn, window, settle, idleWindows)
	b.WriteString("| processes before the agent | processes listed | started during the windows | agent CPU | its range | target |\n")
	b.WriteString("| ---: | ---: | ---: | ---: | ---: | ---: |\n")
	targets := map[int]float64{1000: 0.5, 100: 0.2}
	var verdicts []string
	for _, n := range counts {
		idle.keep(n)
		cpus, listed, after := idleAgentCPU(window, settle)
		slices.Sort(cpus)
		cpu := cpus[len(cpus)/2]
		target := "-"
		if t, ok := targets[n]; ok && !*smoke {
			target = fmt.Sprintf("%.1f%%", t)
			verdicts = append(verdicts, fmt.Sprintf("%.1f%% at %d processes: %s (%.2f%%)", t, n, verdict(cpu < t), cpu))
		}
		fmt.Fprintf(&b, "| %d | %d | %d | %.2f%% | %.2f-%.2f%% | %s |\n", n, listed, after, cpu, cpus[0], cpus[len(cpus)-1], target)
	}
	if len(verdicts) > 0 {
		fmt.Fprintf(&b, "\nTargets: %s.\n", strings.Join(verdicts, "; "))
	}
	return b.String()
}

// idleChurn is how often a process starts on the bench's node.
const idleChurn = 1500 * time.Millisecond

// idleWindows is how many windows the idle agent is measured over.
const idleWindows = 3

// idleAgentCPU starts the agent, gives it settle for its first scan, and
// returns its CPU over each of idleWindows windows while a process starts
// every idleChurn, the processes /proc listed and how many started.
func idleAgentCPU(window, settle time.Duration) (cpus []float64, listed, started int) {
	agent := startAgentUntil("waiting for a process", "--metrics-address", "127.0.0.1:0", "--control-socket", "")
	defer func() {
		agent.Process.Signal(os.Interrupt)
		agent.Wait()
	}()
	time.Sleep(settle)
	listed = countProcesses()
	later := &idleProcesses{started: time.Now()}
	defer later.stop()
	ticker := time.NewTicker(idleChurn)
	defer ticker.Stop()
	for range idleWindows {
		cpu0, start := cpuTime(agent.Process.Pid), time.Now()
		for time.Since(start) < window {
			<-ticker.C
			cmd := exec.Command("sleep", "600")
			check(cmd.Start())
			later.cmds = append(later.cmds, cmd)
		}
		cpus = append(cpus, coreShare(cpuTime(agent.Process.Pid)-cpu0, time.Since(start)))
	}
	return cpus, listed, len(later.cmds)
}
