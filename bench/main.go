// Command bench measures gpu-mem against the physical floor and against
// Inspektor Gadget's profile_cuda program, side by side in one run, and
// writes BENCHMARKS.md. Run it as root after `make build sim` (make bench).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/gpu-mem/gpu-mem/bench/machine"
)

var (
	smoke   = flag.Bool("smoke", false, "a short run that checks the harness, not the figures")
	out     = flag.String("o", "BENCHMARKS.md", "where to write the results")
	repo    = flag.String("repo", ".", "the repository root (build/sim and bin/ built)")
	only    = flag.String("only", "", "run one section: costs, rates, agent, latency, load, symbols, discovery, idle, nvml or state")
	runs    = 5
	simLib  string
	simwork string
	gpumem  string
	lean    string // the agent image's build
)

func main() {
	flag.Parse()
	if *smoke {
		runs = 1
	}
	root, err := filepath.Abs(*repo)
	check(err)
	simLib = filepath.Join(root, "build/sim/libcuda.so.1")
	simwork = filepath.Join(root, "build/sim/simwork")
	gpumem = filepath.Join(root, "bin/gpumem")
	lean = filepath.Join(root, "bin/gpumem-lean")
	needs := map[string][]string{"symbols": nil, "discovery": {simLib, lean}, "idle": {lean}}
	built, ok := needs[*only]
	if !ok {
		built = []string{simLib, simwork, gpumem, lean}
	}
	for _, f := range built {
		if _, err := os.Stat(f); err != nil {
			fatalf("%s missing: run make build sim first", f)
		}
	}
	if os.Getenv(inNamespace) != "" {
		fmt.Print(discoveryInNamespace())
		return
	}

	var report strings.Builder
	header(&report)
	report.WriteString(gpuSection(root))
	for _, s := range []struct {
		name, title string
		run         func() string
	}{
		{"costs", "What does tracing add to one driver allocation?", func() string { return costs(root) }},
		{"rates", "How many events a second without loss?", rates},
		{"agent", "What does the agent take, CPU and memory?", agentFootprint},
		{"latency", "How soon is a new process traced?", attachLatency},
		{"load", "How long does the BPF object take to load?", func() string { return loadTimes(root) }},
		{"symbols", "What does naming the first stack through large C++ libraries cost?", func() string { return symbolsFirstStack(root) }},
		{"discovery", "What does finding processes cost, against how many run?", discoveryCost},
		{"idle", "What does the idle agent cost a node?", idleCost},
		{"nvml", "What does reading NVML cost?", func() string { return nvmlCost(root) }},
		{"state", "What does keeping the agent's state for its next restart cost?", stateCost},
	} {
		switch *only {
		case "":
			fmt.Fprintf(os.Stderr, "bench: %s\n", s.name)
			section(&report, s.title, measuredBy(s.name)+s.run())
		case s.name:
			fmt.Fprintf(os.Stderr, "bench: %s\n", s.name)
			check(replaceSection(*out, s.title, measuredBy(s.name)+s.run()))
			fmt.Fprintf(os.Stderr, "bench: wrote its section of %s\n", *out)
			return
		}
	}
	report.WriteString(soakSection(root))
	check(os.WriteFile(*out, []byte(report.String()), 0o644))
	fmt.Fprintf(os.Stderr, "bench: wrote %s\n", *out)
}

func header(w io.Writer) {
	fmt.Fprintf(w, "# Benchmarks\n\n"+
		"What gpu-mem costs, one question a section. A section's figures were measured side by side in one run\n"+
		"(its ratios compare figures of that run), on the machine it names, by the command it gives. The sections\n"+
		"`go run ./bench` measures run on the simulated driver (`tests/simcuda`), whose calls cost ~100 ns: their\n"+
		"figures are the probes' own cost, where a real cuMemAlloc + cuMemFree pair costs 80-150 us; a measure it\n"+
		"repeats is the median of %d runs. How the harness works and what to keep in mind reading it:\n"+
		"[bench/README.md](bench/README.md).\n", runs)
}

// measuredBy says where and how a section of this run is measured: a
// section measured alone (-only) may come from another machine than the
// rest.
func measuredBy(name string) string {
	return fmt.Sprintf("Measured on %s, by `go run ./bench -only %s` (as root, after `make build sim`; `make bench` runs every section).\n\n",
		machine.Describe(), name)
}

func section(w *strings.Builder, title, body string) {
	fmt.Fprintf(w, "\n## %s\n\n%s", title, body)
}

// replaceSection puts body in place of section title of the results in
// file, measured alone (-only), and keeps every other section as it was.
func replaceSection(file, title, body string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("results to update: %w", err)
	}
	text := string(data)
	heading := "\n## " + title + "\n"
	start := strings.Index(text, heading)
	if start < 0 {
		return fmt.Errorf("%s has no section %q: run make bench for the whole file", file, title)
	}
	end := len(text)
	if next := strings.Index(text[start+len(heading):], "\n## "); next >= 0 {
		end = start + len(heading) + next
	}
	var b strings.Builder
	b.WriteString(text[:start])
	section(&b, title, body)
	b.WriteString(text[end:])
	return os.WriteFile(file, []byte(b.String()), 0o644)
}

// runWorkload runs a workload to completion (SIMWORK_NOWAIT) and returns its
// expect values.
func runWorkload(env []string, name string, args ...string) map[string]float64 {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), append(env, "SIMWORK_NOWAIT=1")...)
	cmd.Stdin = strings.NewReader("\n\n")
	out, err := cmd.Output()
	if err != nil {
		fatalf("%s %v: %v", name, args, err)
	}
	expect := map[string]float64{}
	for _, line := range strings.Split(string(out), "\n") {
		if fields, ok := strings.CutPrefix(line, "expect "); ok {
			for _, kv := range strings.Fields(fields) {
				k, v, _ := strings.Cut(kv, "=")
				expect[k], _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	return expect
}

func median(xs []float64) float64 {
	sort.Float64s(xs)
	return xs[len(xs)/2]
}

func check(err error) {
	if err != nil {
		fatalf("%v", err)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(1)
}
