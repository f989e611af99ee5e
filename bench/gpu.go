package main

import (
	"os"
	"path/filepath"
)

// gpuSection is the GPU part: the real model's, measured on the GPU
// machine by bench/gpu/model.sh and written by model_report.py into
// bench/gpu/MODEL.md, then bench/gpu/run.sh's, kept in
// bench/gpu/RESULTS.md: both are copied in as they are.
func gpuSection(root string) string {
	section := recordedSection(root, "bench/gpu/MODEL.md", "\n## What does the agent cost a real model?\n\nNot measured yet: see bench/gpu/model.sh.\n")
	return section + recordedSection(root, "bench/gpu/RESULTS.md", "\n## How does it compare with PyTorch's own `_record_memory_history`?\n\nNot measured yet: see bench/gpu/run.sh.\n")
}

// soakSection is the soak's, run apart for 30 minutes by `make soak` and
// kept in bench/soak/RESULTS.md, copied in as it is.
func soakSection(root string) string {
	return recordedSection(root, "bench/soak/RESULTS.md", "\n## Does the agent stay flat under hours of churn?\n\nNot measured yet: see `make soak`.\n")
}

// recordedSection is a part measured apart and kept in file, its heading
// included, or missing when there is none.
func recordedSection(root, file, missing string) string {
	data, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		return missing
	}
	return "\n" + string(data)
}
