package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReplaceSection: a section measured alone replaces its own, and every
// other section stays as it was, byte for byte.
func TestReplaceSection(t *testing.T) {
	file := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	before := "# Benchmarks\n\nMeasured before.\n\n## Costs\n\nold costs\n\n## Load time\n\nold load\n| a | 1 |\n\n## Notes\n\nkept\n"
	if err := os.WriteFile(file, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := replaceSection(file, "Load time", "new load\n"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	got := string(data)
	want := "# Benchmarks\n\nMeasured before.\n\n## Costs\n\nold costs\n\n## Load time\n\nnew load\n\n## Notes\n\nkept\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}

	if err := replaceSection(file, "Notes", "new notes\n"); err != nil {
		t.Fatal(err)
	}
	data, err = os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if text := string(data); !strings.HasSuffix(text, "## Notes\n\nnew notes\n") || strings.Contains(text, "kept") || !strings.Contains(text, "new load\n") {
		t.Errorf("the last section not replaced to the end of the file, or another changed:\n%s", text)
	}

	if err := replaceSection(file, "Symbols", "x"); err == nil || !strings.Contains(err.Error(), `no section "Symbols"`) {
		t.Errorf("a missing section: %v", err)
	}
}
