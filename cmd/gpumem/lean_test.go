package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLeanBuildLeavesOutImages: the agent image's build (-tags lean) links
// no IG package (image store, OCI, runtime, operators), nor client-go and
// the Kubernetes API's types, whose code and package init would count in
// the agent's memory.
func TestLeanBuildLeavesOutImages(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "lean", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	for _, dep := range deps {
		for _, unwanted := range []string{
			"github.com/inspektor-gadget/inspektor-gadget",
			"k8s.io/client-go",
			"k8s.io/api",
		} {
			if dep == unwanted || strings.HasPrefix(dep, unwanted+"/") {
				t.Errorf("the lean build links %s", dep)
			}
		}
	}
	if len(deps) < 100 {
		t.Fatalf("go list found %d packages: %s", len(deps), out)
	}
}
