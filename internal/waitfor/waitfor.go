// Package waitfor is how tests wait for a fact: a condition checked until
// it holds, or the test fails with what it waited for. One helper for every
// package's tests, so that each waits the same way and says the same.
package waitfor

import (
	"testing"
	"time"
)

// Poll is how often a condition is checked.
const Poll = 20 * time.Millisecond

// Condition waits until cond holds, checking it every Poll, and fails t
// with what if it does not within limit.
func Condition(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, limit)
		}
		time.Sleep(Poll)
	}
}
