// Command gen writes gpu-mem's Grafana dashboard (package dashboards) to
// each of dashboards.Outputs, its alerts to dashboards.RulesOutputs and the
// chart's dashboards.RuleTemplatePath, under the root of the module it runs in:
// `go generate ./dashboards/...` or `go run ./dashboards/gen`.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpu-mem/gpu-mem/dashboards"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dashboards/gen:", err)
		os.Exit(1)
	}
}

func run() error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	data, err := dashboards.JSON()
	if err != nil {
		return err
	}
	outputs := map[string][]byte{dashboards.RuleTemplatePath: dashboards.RuleTemplate()}
	for _, out := range dashboards.Outputs {
		outputs[out] = data
	}
	for _, out := range dashboards.RulesOutputs {
		outputs[out] = dashboards.RulesFile()
	}
	for out, data := range outputs {
		if err := write(filepath.Join(root, out), data); err != nil {
			return err
		}
	}
	return nil
}

// write writes data to path, unless it holds them already (its time
// kept).
func write(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return err
	}
	fmt.Println("wrote", path)
	return nil
}

// moduleRoot is the closest folder at or above the working directory that
// holds go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod at or above the working directory")
		}
		dir = parent
	}
}
