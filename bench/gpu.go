package main

import (
	"os"
	"path/filepath"
)

// gpuSection is the GPU part, measured on the GPU machine with
// bench/gpu/run.sh and kept in bench/gpu/RESULTS.md, then the analysis of
// the targets missed, bench/NOTES.md: both are copied in as they are.
func gpuSection(root string) string {
	section := "\n## On the GPU\n\nNot measured yet: see bench/gpu/run.sh.\n"
	if data, err := os.ReadFile(filepath.Join(root, "bench/gpu/RESULTS.md")); err == nil {
		section = "\n" + string(data)
	}
	if data, err := os.ReadFile(filepath.Join(root, "bench/NOTES.md")); err == nil {
		section += "\n" + string(data)
	}
	return section
}
