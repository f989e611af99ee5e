package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// nvmlHolders are the processes on the simulated GPU while NVML is read:
// a busy node's.
const nvmlHolders = 16

// nvmlCost times one read of NVML (bench/nvmlcost: every GPU's memory and
// process list) on the simulated NVML with nvmlHolders processes holding
// memory, and says what the agent's reads cost at their rate.
func nvmlCost(root string) string {
	dir, err := os.MkdirTemp("", "gpumem-nvml")
	check(err)
	defer os.RemoveAll(dir)
	env := []string{"SIMNVML_DIR=" + dir}
	for range nvmlHolders {
		cmd := exec.Command(simwork, "hold", "1048576")
		cmd.Env = append(os.Environ(), env...)
		stdin, err := cmd.StdinPipe()
		check(err)
		check(cmd.Start())
		defer func() { stdin.Close(); cmd.Wait() }()
	}
	waitListed(dir, nvmlHolders)
	reads := 2000
	if *smoke {
		reads = 20
	}
	cmd := exec.Command("go", "run", "./bench/nvmlcost", "-library", filepath.Join(root, "build/sim/nvml/libnvidia-ml.so.1"),
		"-reads", fmt.Sprint(reads))
	cmd.Dir, cmd.Env, cmd.Stderr = root, append(os.Environ(), append(env, "CGO_ENABLED=0")...), os.Stderr
	out, err := cmd.Output()
	check(err)
	var us float64
	var listed int
	_, err = fmt.Sscanf(strings.TrimSpace(string(out)), "nvml read: median %f us over %d reads (%d processes listed)", &us, &reads, &listed)
	check(err)
	const every = 500 * time.Millisecond // the scan interval: the steady rate of reads
	var b strings.Builder
	b.WriteString("| what | per read | share of one core at one read per scan (500 ms) |\n| --- | ---: | ---: |\n")
	fmt.Fprintf(&b, "| NVML read, simulated NVML, %d processes | %.1f us | %.4f%% |\n", listed, us, us/float64(every.Microseconds())*100)
	b.WriteString("\nThe agent reads NVML (every GPU's memory and process list) at each scan, when a context is made or\n")
	b.WriteString("destroyed, after an out-of-memory failure and before each snapshot, on a job of its own, never on the\n")
	b.WriteString("goroutine that reads events. The simulated NVML reads a directory; `tests/gpu/run_nvml.sh` times the\n")
	b.WriteString("driver's own.\n")
	return b.String()
}

// waitListed waits until n simulated processes published their memory.
func waitListed(dir string, n int) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if entries, _ := os.ReadDir(dir); len(entries) >= n {
			return
		}
	}
	fatalf("simulated processes did not start")
}
