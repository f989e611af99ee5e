package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadBreakdownRulesRefused: a rules file with a bad line stops the
// command at its start, naming the file, the line and why.
func TestBadBreakdownRulesRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "my.rules")
	if err := os.WriteFile(path, []byte("# mine\nparameters function=load\nweights function=f\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, command := range []string{"record", "top", "agent"} {
		cmd := newRootCommand()
		cmd.SetArgs([]string{command, "--breakdown-rules", path})
		cmd.SetOut(&strings.Builder{})
		cmd.SetErr(&strings.Builder{})
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), path+`:3: unknown category "weights"`) {
			t.Errorf("%s: %v, want the file's line 3 refused", command, err)
		}
	}
}
