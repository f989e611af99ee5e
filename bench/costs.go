package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/gpu-mem/gpu-mem/profiler"
)

// variant is a tracer set up around a measurement; stop removes it.
type variant struct {
	name  string
	start func() (stop func())
}

func costs(root string) string {
	variants := []variant{
		{"no tracing", func() func() { return func() {} }},
		{"floor: empty entry and return programs", attachFloor},
		{"gpu-mem", startGPUMem},
		{"IG profile_cuda program", func() func() { return attachProfileCUDA(root) }},
	}
	pairs := "200000"
	pyEnv := []string{"SIMCUDA_LIB=" + simLib, "SIMWORK_PAIRS=20000"}
	if *smoke {
		pairs, pyEnv[1] = "2000", "SIMWORK_PAIRS=500"
	}
	python := "/root/.pyenv/versions/3.12.1/bin/python3.12"
	script := filepath.Join(root, "tests/workloads/simwork.py")

	c := map[string]float64{}
	py := map[string]float64{}
	for _, v := range variants {
		var cs, ps []float64
		for range runs {
			stop := v.start()
			cs = append(cs, runWorkload(nil, simwork, "pairs", pairs)["ns_per_pair"])
			if v.name != "IG profile_cuda program" {
				ps = append(ps, runWorkload(pyEnv, python, script, "pairs")["ns_per_pair"])
			}
			stop()
		}
		c[v.name] = median(cs)
		if len(ps) > 0 {
			py[v.name] = median(ps)
		}
	}
	floor := c["floor: empty entry and return programs"]
	var b strings.Builder
	fmt.Fprintf(&b, "One thread calls cuMemAlloc_v2 then cuMemFree_v2 (4 KiB) in a loop (`simwork pairs %s`): the time\n", pairs)
	b.WriteString("per pair under each tracer. The floor is empty programs on the same two functions: the uprobe and\n")
	b.WriteString("uretprobe traps any uprobe tracer pays.\n\n")
	b.WriteString("| C caller | ns per pair | added over no tracing | ratio to the floor |\n| --- | ---: | ---: | ---: |\n")
	for _, v := range variants {
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.2fx |\n", v.name, c[v.name], c[v.name]-c["no tracing"], c[v.name]/floor)
	}
	pyFloor := py["floor: empty entry and return programs"]
	b.WriteString("\nThe same pairs from Python through ctypes (`simwork.py pairs`, CPython 3.12), where gpu-mem also\n")
	b.WriteString("walks the Python frames:\n\n| Python caller | ns per pair | added over no tracing | ratio to the floor |\n| --- | ---: | ---: | ---: |\n")
	for _, v := range variants[:3] {
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.2fx |\n", v.name, py[v.name], py[v.name]-py["no tracing"], py[v.name]/pyFloor)
	}
	pyFrames := (py["gpu-mem"] - pyFloor) - (c["gpu-mem"] - floor)
	fmt.Fprintf(&b, "\nExtra cost of Python capture per event: %.0f ns (gpu-mem's cost over the floor from Python,\n", pyFrames/2)
	b.WriteString("less the same from C, per pair, halved: frames are walked for the allocation only, so this\n")
	b.WriteString("is per allocation).\n\n")
	fmt.Fprintf(&b, "Targets: gpu-mem with native stacks at most 1.3x the floor (%s: %.2fx); with Python\n", verdict(c["gpu-mem"]/floor <= 1.3), c["gpu-mem"]/floor)
	fmt.Fprintf(&b, "frames at most 2x (%s: %.2fx); cheaper than profile_cuda (%s: %.0f vs %.0f ns), which\n",
		verdict(py["gpu-mem"]/pyFloor <= 2), py["gpu-mem"]/pyFloor, verdict(c["gpu-mem"] < c["IG profile_cuda program"]), c["gpu-mem"], c["IG profile_cuda program"])
	b.WriteString("traces neither frees nor Python frames.\n")
	return b.String()
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// attachFloor puts empty entry and return programs on the two functions.
func attachFloor() func() {
	spec := &ebpf.ProgramSpec{
		Type:         ebpf.Kprobe,
		AttachType:   ebpf.AttachTraceUprobeMulti,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	}
	prog, err := ebpf.NewProgram(spec)
	check(err)
	ex, err := link.OpenExecutable(simLib)
	check(err)
	symbols := []string{"cuMemAlloc_v2", "cuMemFree_v2"}
	enter, err := ex.UprobeMulti(symbols, prog, nil)
	check(err)
	leave, err := ex.UretprobeMulti(symbols, prog, nil)
	check(err)
	return func() { enter.Close(); leave.Close(); prog.Close() }
}

// startGPUMem runs the whole profiler in this process, as gpumem does.
func startGPUMem() func() {
	p, err := profiler.New(profiler.Config{Library: simLib})
	check(err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	return func() {
		cancel()
		check(<-done)
		check(p.Close())
	}
}

// attachProfileCUDA compiles IG's profile_cuda gadget from the IG module and
// attaches its programs to the same library, with the same loader.
func attachProfileCUDA(root string) func() {
	obj := compileProfileCUDA(root)
	spec, err := ebpf.LoadCollectionSpec(obj)
	check(err)
	// IG sizes ig_build_id at run time and sets collect_ustack from its
	// parameters; give them the values IG uses when stacks are asked for.
	spec.Maps["ig_build_id"].MaxEntries = 1024
	check(spec.Variables["collect_ustack"].Set(true))
	coll, err := ebpf.NewCollection(spec)
	check(err)
	ex, err := link.OpenExecutable(simLib)
	check(err)
	var links []link.Link
	for name, ps := range spec.Programs {
		kind, symbol, ok := strings.Cut(ps.SectionName, "/libcuda:")
		if !ok {
			continue
		}
		var l link.Link
		if kind == "uretprobe" {
			l, err = ex.Uretprobe(symbol, coll.Programs[name], nil)
		} else {
			l, err = ex.Uprobe(symbol, coll.Programs[name], nil)
		}
		check(err)
		links = append(links, l)
	}
	return func() {
		for _, l := range links {
			l.Close()
		}
		coll.Close()
	}
}

func compileProfileCUDA(root string) string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/inspektor-gadget/inspektor-gadget").Output()
	check(err)
	ig := strings.TrimSpace(string(out))
	obj := filepath.Join(root, "build", "profile_cuda.bpf.o")
	cmd := exec.Command("clang-19", "-target", "bpf", "-O2", "-g", "-D__TARGET_ARCH_x86",
		"-isystem", filepath.Join(ig, "include/gadget/amd64"), "-isystem", filepath.Join(ig, "include"),
		"-DBPF_UPROBE(...)=BPF_KPROBE(__VA_ARGS__)",
		"-c", filepath.Join(ig, "gadgets/profile_cuda/program.bpf.c"), "-o", obj)
	cmd.Stderr = os.Stderr
	check(cmd.Run())
	return obj
}
