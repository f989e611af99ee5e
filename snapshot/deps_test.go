package snapshot

import (
	"os/exec"
	"strings"
	"testing"
)

// TestOutputsLinkNoBPF: the output model, every output reading it and the
// profiler's policies (nvmlparts, budget) link neither the engine (profiler,
// tracer) nor cilium/ebpf and the embedded BPF object: a folded-stack
// writer, or the parting of NVML's numbers, is plain code.
func TestOutputsLinkNoBPF(t *testing.T) {
	outputs := []string{".", "../report", "../pprof", "../metrics", "../profiledata", "../pyroscope", "../nvmlparts", "../budget"}
	out, err := exec.Command("go", append([]string{"list", "-deps"}, outputs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/cilium/ebpf") || dep == "github.com/gpu-mem/gpu-mem/profiler" || dep == "github.com/gpu-mem/gpu-mem/tracer" {
			t.Errorf("an output links %s", dep)
		}
	}
}
