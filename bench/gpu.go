package main

import (
	"os"
	"path/filepath"
)

// gpuSection is the GPU part, measured on the GPU machine with
// bench/gpu/run.sh and kept in bench/gpu/RESULTS.md: it is copied in as is.
func gpuSection(root string) string {
	data, err := os.ReadFile(filepath.Join(root, "bench/gpu/RESULTS.md"))
	if err != nil {
		return "\n## On the GPU\n\nNot measured yet: see bench/gpu/run.sh.\n"
	}
	return "\n" + string(data)
}
