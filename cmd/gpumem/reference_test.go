//go:build !lean

package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// committedReference is docs/reference, from this package's folder.
const committedReference = "../../docs/reference"

// TestReferenceIsGenerated: docs/reference is what gpumem reference writes
// from this tree, byte for byte, and no more: a command, flag, help text or
// metric changed without `make docs`, or a page edited by hand, fails here.
func TestReferenceIsGenerated(t *testing.T) {
	dir := t.TempDir()
	if err := writeReference(dir); err != nil {
		t.Fatal(err)
	}
	want, got := readPages(t, dir), readPages(t, committedReference)
	for name, page := range want {
		if committed, ok := got[name]; !ok {
			t.Errorf("docs/reference/%s is missing: run make docs", name)
		} else if committed != page {
			t.Errorf("docs/reference/%s is not what gpumem reference writes: run make docs, and do not edit it by hand", name)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("docs/reference/%s is not generated (its command is gone?): run make docs", name)
		}
	}
}

// readPages are the files under dir, by path relative to it.
func readPages(t *testing.T, dir string) map[string]string {
	t.Helper()
	pages := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		pages[rel] = string(data)
		return err
	})
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	return pages
}
