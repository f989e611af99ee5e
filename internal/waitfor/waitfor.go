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
	if !until(limit, cond) {
		t.Fatalf("no %s within %v", what, limit)
	}
}

// Value waits until ok accepts what get returns, reading it every Poll,
// and returns it; if ok does not within limit, it fails t with what and
// the last value read, which tells why.
func Value[T any](t testing.TB, what string, limit time.Duration, get func() T, ok func(T) bool) T {
	t.Helper()
	var v T
	if !until(limit, func() bool { v = get(); return ok(v) }) {
		t.Fatalf("no %s within %v: the last %+v", what, limit, v)
	}
	return v
}

// until checks cond every Poll until it holds (true) or limit passes.
func until(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(Poll)
	}
	return true
}
