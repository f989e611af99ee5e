package report

import (
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Printable is a name a traced process controls (its comm, a function, file
// or pod name) as text for a terminal: unchanged unless it holds a control
// character (an escape sequence, a tab, a line break) or invalid UTF-8,
// which are then written as Go escapes (\x1b, \t, \n, \xff).
func Printable(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) {
			q := strconv.QuoteToGraphic(s)
			return q[1 : len(q)-1]
		}
	}
	return s
}
