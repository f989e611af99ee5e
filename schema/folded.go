package schema

import (
	"strings"
	"unicode"
)

// The folded form of a stack (Brendan Gregg's flame graph input, and the
// stack field of a profile row): frame names, outermost first, separated
// by ';'. FoldedName makes a name one such field; JoinFolded and
// SplitFolded turn frames into that form and back.

// FoldedName is a name as one field of a folded stack: ';' separates the
// fields and '\n' the lines, so ';' becomes ':' and each control character
// a space; invalid UTF-8 becomes U+FFFD.
func FoldedName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == ';':
			return ':'
		case unicode.IsControl(r):
			return ' '
		}
		return r
	}, s)
}

// JoinFolded is the folded stack of names, outermost first.
func JoinFolded(names []string) string {
	folded := make([]string, len(names))
	for i, name := range names {
		folded[i] = FoldedName(name)
	}
	return strings.Join(folded, ";")
}

// SplitFolded is the names of a folded stack, outermost first.
func SplitFolded(stack string) []string {
	if stack == "" {
		return nil
	}
	return strings.Split(stack, ";")
}
