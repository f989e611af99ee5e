// Package machine describes the machine a benchmark ran on, for the
// header of its figures.
package machine

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// Describe is "CPU model, kernel K, N CPUs".
func Describe() string {
	return fmt.Sprintf("%s, kernel %s, %d CPUs", CPUModel(), Kernel(), CPUs())
}

// CPUModel is the first model name of /proc/cpuinfo.
func CPUModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// CPUs is what nproc says.
func CPUs() int {
	out, _ := exec.Command("nproc").Output()
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

// Kernel is the kernel release.
func Kernel() string {
	out, _ := exec.Command("uname", "-r").Output()
	return strings.TrimSpace(string(out))
}
