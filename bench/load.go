package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/gpu-mem/gpu-mem/tracer"
)

// loadTimes measures loading program.bpf.c's object two ways: what gpumem
// loads (its own programs, tracer.New) and the whole object as stock IG
// loads it (every program, with the in-kernel totals and user stacks on).
func loadTimes(root string) string {
	gpumemLoad := timeRuns(func() {
		t, err := tracer.New(tracer.Options{})
		check(err)
		t.Close()
	})
	object := filepath.Join(root, "tracer/gpumem_x86_bpfel.o")
	var programs int
	igLoad := timeRuns(func() {
		spec, err := ebpf.LoadCollectionSpec(object)
		check(err)
		spec.Maps["ig_build_id"].MaxEntries = 1024 // as IG sizes it at run time
		check(spec.Variables["aggregate"].Set(true))
		check(spec.Variables["collect_ustack"].Set(true))
		coll, err := ebpf.NewCollection(spec)
		check(err)
		programs = len(coll.Programs)
		coll.Close()
	})
	var b strings.Builder
	b.WriteString("| loader | programs | load time | ratio |\n| --- | ---: | ---: | ---: |\n")
	fmt.Fprintf(&b, "| gpumem (`tracer.New`) | 4 | %.2f s | 1.00x |\n", gpumemLoad)
	fmt.Fprintf(&b, "| the whole object, as stock IG loads it | %d | %.2f s | %.2fx |\n", programs, igLoad, igLoad/gpumemLoad)
	b.WriteString("\nStock IG loads every program of the image: an entry program per driver function (23), a\n")
	b.WriteString("return program per allocation and context function (frees have none), gpumem's own, and\n")
	b.WriteString("gpumem_finish, which every allocation's return program tail-calls: the Python frame walk\n")
	b.WriteString("and the stack walk are checked by the verifier once there, not in each return program.\n")
	fmt.Fprintf(&b, "Target: the whole object in under 3 s (%s: %.2f s).\n", verdict(igLoad < 3), igLoad)
	b.WriteString(verifierHeadroom(object))
	return b.String()
}

// verifierLimit is the instructions the kernel's verifier walks in one
// program before it refuses it (BPF_COMPLEXITY_LIMIT_INSNS).
const verifierLimit = 1_000_000

var processedInsns = regexp.MustCompile(`processed (\d+) insns`)

// verifierHeadroom says how much of the verifier's limit each of gpumem's
// programs with stacks takes: a program near it is refused after a small
// change (to the walks, or by another kernel's verifier), so it bounds any
// change to them.
func verifierHeadroom(object string) string {
	spec, err := ebpf.LoadCollectionSpec(object)
	check(err)
	spec.Maps["ig_build_id"].MaxEntries = 1024
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}})
	check(err)
	defer coll.Close()
	var lines []string
	for name, p := range coll.Programs {
		m := processedInsns.FindStringSubmatch(p.VerifierLog)
		if m == nil {
			continue
		}
		n, err := strconv.Atoi(m[1])
		check(err)
		if n > verifierLimit/10 {
			lines = append(lines, fmt.Sprintf("| %s | %d | %.0f%% |\n", name, n, 100*float64(n)/verifierLimit))
		}
	}
	slices.Sort(lines)
	var b strings.Builder
	b.WriteString("\nWhat the verifier walks in each program above a tenth of its limit (1,000,000 instructions), gpumem's\n")
	b.WriteString("options (the tensor and driver paths walk Python stacks; a program past the limit is refused at load):\n\n")
	b.WriteString("| program | instructions processed | of the limit |\n| --- | ---: | ---: |\n")
	for _, l := range lines {
		b.WriteString(l)
	}
	return b.String()
}

// timeRuns is the median wall time of runs calls of f, in seconds.
func timeRuns(f func()) float64 {
	var xs []float64
	for range runs {
		start := time.Now()
		f()
		xs = append(xs, time.Since(start).Seconds())
	}
	return median(xs)
}
