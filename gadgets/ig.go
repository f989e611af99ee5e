//go:build tools

// Package gadgets holds companion gadgets and the BPF headers shared with
// the root gadget. This file pins the Inspektor Gadget module in go.mod:
// program.bpf.c is compiled against its BPF headers (include/gadget), and
// the gpu-mem operators plug into its runtime.
package gadgets

import _ "github.com/inspektor-gadget/inspektor-gadget/pkg/operators"
