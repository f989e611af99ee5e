package schema

import (
	"slices"
	"testing"
)

func TestFoldedRoundTrip(t *testing.T) {
	names := []string{"main", "operator;()", "line\nbreak", "bad \xff byte", ""}
	want := []string{"main", "operator:()", "line break", "bad \uFFFD byte", ""}
	if got := SplitFolded(JoinFolded(names)); !slices.Equal(got, want) {
		t.Errorf("round trip %q, want %q", got, want)
	}
	if got := SplitFolded(""); got != nil {
		t.Errorf("empty stack: %q", got)
	}
}
