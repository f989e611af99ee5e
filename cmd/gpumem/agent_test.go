package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// TestMemoryLimitFollowsTheContainer: the Go heap's bound is the container's
// limit less what lives outside the heap, never below the floor, 128 MiB
// without a limit; a value that is not bytes is refused.
func TestMemoryLimitFollowsTheContainer(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want int64
	}{
		{"", 128 << 20},
		{"268435456", 192 << 20}, // the chart's 256Mi
		{"100000000", 64 << 20},
	} {
		t.Setenv("GPUMEM_MEMORY_LIMIT", tc.env)
		if got, err := memoryLimit(); err != nil || got != tc.want {
			t.Errorf("GPUMEM_MEMORY_LIMIT=%q: %d %v, want %d", tc.env, got, err, tc.want)
		}
	}
	for _, bad := range []string{"256Mi", "-1", "0"} {
		t.Setenv("GPUMEM_MEMORY_LIMIT", bad)
		if _, err := memoryLimit(); err == nil {
			t.Errorf("GPUMEM_MEMORY_LIMIT=%q accepted", bad)
		}
	}
}

// TestNodeNameAndItsDeprecatedAlias: --node-name is the node, and --node,
// which used to set the profiles' node label alone, still sets it, said
// deprecated, so that existing command lines keep working.
func TestNodeNameAndItsDeprecatedAlias(t *testing.T) {
	for flag, said := range map[string]string{
		"--node-name": "",
		"--node":      "Flag --node has been deprecated, use --node-name\n",
	} {
		fs := newAgentCommand().Flags()
		var out bytes.Buffer
		fs.SetOutput(&out)
		if err := fs.Parse([]string{flag, "node-7"}); err != nil {
			t.Fatalf("%s: %v", flag, err)
		}
		if got := fs.Lookup("node-name").Value.String(); got != "node-7" || out.String() != said {
			t.Errorf("%s node-7: node %q, said %q; want node-7, said %q", flag, got, out.String(), said)
		}
	}
}

// TestAgentFlagsByGroup: the agent's help lists its flags under a heading
// for each system it talks to, the budgets' calibration hidden but
// accepted.
func TestAgentFlagsByGroup(t *testing.T) {
	cmd := newAgentCommand()
	if usage := cmd.UsageString(); !strings.Contains(usage, "\n\nPyroscope flags:\n      --gpu-observability-profiles ") {
		t.Errorf("help without the Pyroscope flags' heading:\n%s", usage)
	}
	fs := cmd.Flags()
	var headings []string
	for _, s := range flagSections(fs) {
		headings = append(headings, s.Heading)
		if strings.Contains(s.Usages, "pair-cost") {
			t.Errorf("%s lists the pair costs:\n%s", s.Heading, s.Usages)
		}
	}
	want := []string{"Flags", "Budget flags", "Growth flags", "Kubernetes flags", "Prometheus metrics flags", "Pyroscope flags"}
	if !slices.Equal(headings, want) {
		t.Errorf("headings %q, want %q", headings, want)
	}
	if err := fs.Parse([]string{"--tensor-pair-cost", "1ms"}); err != nil || fs.Lookup("tensor-pair-cost").Value.String() != "1ms" {
		t.Errorf("--tensor-pair-cost 1ms: %v", err)
	}
}
