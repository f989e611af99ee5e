package gadgetyaml

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// object is program.bpf.c compiled (make check-generated proves it current).
func object(t *testing.T) *ebpf.CollectionSpec {
	spec, err := ebpf.LoadCollectionSpec("../tracer/gpumem_x86_bpfel.o")
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

func TestGadgetYAMLIsValid(t *testing.T) {
	m, err := Read("../gadget.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(m, object(t)); err != nil {
		t.Fatal(err)
	}
	for _, ds := range []string{"cuda", "allocated", "live", "processes"} {
		if m.DataSources[ds] == nil {
			t.Errorf("data source %s not described", ds)
		}
	}
}

// TestBrokenGadgetYAML breaks the real gadget.yaml one way at a time; each
// must be refused with a message naming the problem.
func TestBrokenGadgetYAML(t *testing.T) {
	original, err := os.ReadFile("../gadget.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, old, new, want string }{
		{"unknown top-level key", "sourceURL:", "sourceURL2:", "field sourceURL2 not found"},
		{"unknown field key", "      bytes:\n        annotations:", "      bytes:\n        annotation:", "field annotation not found"},
		{"unknown annotation", "columns.hex: \"true\"", "columns.hexa: \"true\"", `field address: unknown annotation "columns.hexa"`},
		{"bad width", "columns.width: \"18\"", "columns.width: wide", `field address: columns.width is "wide", want a positive number`},
		{"bad alignment", "          columns.alignment: right\n          columns.width: \"12\"", "          columns.alignment: centre\n          columns.width: \"12\"",
			`field bytes: columns.alignment is "centre", want one of left, right`},
		{"bad metrics type", "metrics.type: gauge\n          metrics.name: gpumem_live_bytes", "metrics.type: meter\n          metrics.name: gpumem_live_bytes",
			`field live_bytes: metrics.type is "meter", want one of key, counter, gauge, histogram`},
		{"value field not declared", "profiles.value-field: live_bytes", "profiles.value-field: held_bytes", `data source live: profiles.value-field names field "held_bytes"`},
		{"field not in object", "      ustack_len:", "      stack_len:", "data source cuda, field stack_len: not in the object"},
		{"enum's name without its _raw field", "      host:\n        annotations:\n          description: Memory class, CUDA_MEM_DEVICE",
			"      hostname:\n        annotations:\n          description: Memory class, CUDA_MEM_DEVICE", "data source libcuda_mem_stats, field hostname: not in the object"},
		{"data source not in object", "  processes:\n    annotations:", "  procs:\n    annotations:", "data source procs: not in the object"},
		{"program not in object", "  gpumem_leave:\n    attach_to", "  gpumem_return:\n    attach_to", "programs: gpumem_return is not a program of the object"},
	} {
		t.Run(c.name, func(t *testing.T) {
			broken := strings.Replace(string(original), c.old, c.new, 1)
			if broken == string(original) {
				t.Fatalf("gadget.yaml has no %q", c.old)
			}
			path := filepath.Join(t.TempDir(), "gadget.yaml")
			if err := os.WriteFile(path, []byte(broken), 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := Read(path)
			if err == nil {
				err = Check(m, object(t))
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}
