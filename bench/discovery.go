package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpu-mem/gpu-mem/discover"
)

// scanInterval is the profiler's default: how often the agent scans.
const scanInterval = 500 * time.Millisecond

// inNamespace, set, has the bench measure discovery where it runs: as
// process 1 of a PID namespace of its own (discoveryCost).
const inNamespace = "GPUMEM_BENCH_DISCOVERY"

// discoveryCost measures what finding processes costs against how many
// run: the idle agent's CPU (no process calls the driver) with idle
// processes added (sleep), and the scan alone, side by side with the full
// rescan it replaced (every process's maps read at every scan:
// discover.Scan), each called every scanInterval as the agent calls it.
// The bench runs again in a PID namespace of its own, whose /proc lists
// the processes it starts alone: the figures are those of the processes
// counted, not of what else comes and goes on the machine.
func discoveryCost() string {
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Env = append(os.Environ(), inNamespace+"=1")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	out, err := cmd.Output()
	check(err)
	return string(out)
}

// discoveryInNamespace is discoveryCost in the namespace, once /proc is
// its own. The processes are started together and counted down from the
// most, so that each count is measured on processes at least a minute old,
// as a node's mostly are; those left are killed with the namespace.
func discoveryInNamespace() string {
	check(syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, "")) // the new /proc stays here
	check(syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""))
	counts := []int{5000, 1000, 100}
	// settle is how long the agent is given for its first scan, which
	// reads every process.
	age, window, settle := time.Minute, 30*time.Second, 3*time.Second
	if *smoke {
		counts, age, window, settle = []int{100, 10}, time.Second, 2*time.Second, time.Second
	}
	idle := startIdle(counts[0])
	defer idle.stop()
	time.Sleep(age - time.Since(idle.started))
	var b strings.Builder
	b.WriteString("The idle agent (`bin/gpumem-lean agent --library`; no process maps the library) with idle processes\n")
	b.WriteString("(`sleep`) added, and its scan alone (`discover.Scanner`) against the full rescan it replaced\n")
	fmt.Fprintf(&b, "(`discover.Scan`: every process's maps at every scan), both every %v, in a PID namespace of the\n", scanInterval)
	fmt.Fprintf(&b, "bench's own. CPU over %v of wall time: the agent's threads' (their schedstat), the scans' this bench's\n"+
		"(getrusage; the full rescan's over a third of the window).\n", window)
	b.WriteString("A Scanner reads a process's stat a tenth of its age after its last look (30 s at most), and its maps\n")
	b.WriteString("only when the stat changed: the older the processes, the less they cost.\n\n")
	b.WriteString("| idle processes | processes listed | their age | agent CPU | scan CPU | full rescan CPU | ratio |\n")
	b.WriteString("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	var atThousand float64
	for _, n := range append(counts, 0) {
		idle.keep(n)
		ageNow := "-"
		if n > 0 {
			ageNow = fmt.Sprintf("%.0f s", time.Since(idle.started).Seconds())
		}
		agent, scan, full := discoveryCPU(window, settle)
		if n == 1000 {
			atThousand = scan
		}
		fmt.Fprintf(&b, "| %d | %d | %s | %.2f%% | %.3f%% | %.1f%% | %.0fx |\n", n, countProcesses(), ageNow, agent, scan, full, full/scan)
	}
	if !*smoke {
		fmt.Fprintf(&b, "\nTarget: the scan under 0.5%% of a core with 1,000 idle processes: %s (%.3f%%).\n", verdict(atThousand < 0.5), atThousand)
	}
	return b.String()
}

// idleProcesses are sleep processes started together.
type idleProcesses struct {
	started time.Time
	cmds    []*exec.Cmd
}

// startIdle starts n sleep processes, long enough for the section.
func startIdle(n int) *idleProcesses {
	idle := &idleProcesses{started: time.Now()}
	for range n {
		cmd := exec.Command("sleep", "900")
		check(cmd.Start())
		idle.cmds = append(idle.cmds, cmd)
	}
	return idle
}

// keep stops all but n of the processes.
func (idle *idleProcesses) keep(n int) {
	for _, cmd := range idle.cmds[n:] {
		cmd.Process.Kill()
		cmd.Wait()
	}
	idle.cmds = idle.cmds[:n]
}

func (idle *idleProcesses) stop() { idle.keep(0) }

// discoveryCPU returns the CPU, in % of a core, of the idle agent and of
// a Scanner's scans over the same window, and then of full rescans.
func discoveryCPU(window, settle time.Duration) (agent, scan, full float64) {
	a := startIdleAgent(settle)
	s := discover.NewScanner("/proc", "")
	_, err := s.Scan(nil) // every process new: read once, as the agent did
	check(err)
	cpu0, start := cpuTime(a.pid), time.Now()
	scan = cpuOver(window, func() {
		_, err := s.Scan(nil)
		check(err)
	})
	agent = coreShare(cpuTime(a.pid)-cpu0, time.Since(start))
	a.stop()
	full = cpuOver(window/3, func() {
		_, err := discover.Scan("/proc", nil)
		check(err)
	})
	return agent, scan, full
}

// cpuOver calls f every scanInterval (a tick missed while f runs is
// skipped, as the agent's ticker skips it) for window, and returns this
// process's CPU over it, in % of a core.
func cpuOver(window time.Duration, f func()) float64 {
	ticker := time.NewTicker(scanInterval)
	defer ticker.Stop()
	cpu0, start := ownCPU(), time.Now()
	for time.Since(start) < window {
		<-ticker.C
		f()
	}
	return float64(ownCPU()-cpu0) / float64(time.Since(start)) * 100
}

// ownCPU is this process's user+system time.
func ownCPU() time.Duration {
	var ru syscall.Rusage
	check(syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// countProcesses counts the processes /proc lists.
func countProcesses() int {
	entries, err := os.ReadDir("/proc")
	check(err)
	n := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			n++
		}
	}
	return n
}

// idleAgent is a running agent.
type idleAgent struct {
	pid  int
	stop func()
}

// startIdleAgent starts the agent on a library no process maps, and
// returns once its first scan (every process new) is over: settle after
// its attach.
func startIdleAgent(settle time.Duration) idleAgent {
	agent := startAgent()
	time.Sleep(settle)
	return idleAgent{pid: agent.Process.Pid, stop: func() {
		agent.Process.Signal(os.Interrupt)
		agent.Wait()
	}}
}
