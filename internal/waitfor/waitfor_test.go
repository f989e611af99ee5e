package waitfor

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// TestCondition: a condition that comes to hold ends the wait once it does,
// having been checked until then.
func TestCondition(t *testing.T) {
	checks := 0
	Condition(t, "the third check", time.Minute, func() bool { checks++; return checks == 3 })
	if checks != 3 {
		t.Errorf("%d checks, want 3", checks)
	}
}

// TestConditionFails: a condition that never holds fails the test, saying
// what it waited for.
func TestConditionFails(t *testing.T) {
	var failed string
	ft := &fatalRecorder{T: t, fatal: &failed}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Condition(ft, "a miracle", 3*Poll, func() bool { return false })
	}()
	<-done
	if failed != "no a miracle within 60ms" {
		t.Errorf("failed with %q", failed)
	}
}

// TestValue: a value read until it is accepted is returned; one never
// accepted fails the test with the last read.
func TestValue(t *testing.T) {
	reads := 0
	if v := Value(t, "the third read", time.Minute, func() int { reads++; return reads }, func(v int) bool { return v == 3 }); v != 3 {
		t.Errorf("returned %d, want 3", v)
	}
	var failed string
	ft := &fatalRecorder{T: t, fatal: &failed}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Value(ft, "a negative", 3*Poll, func() int { reads++; return reads }, func(v int) bool { return v < 0 })
	}()
	<-done
	if want := fmt.Sprintf("no a negative within 60ms: the last %d", reads); failed != want {
		t.Errorf("failed with %q, want %q", failed, want)
	}
}

// fatalRecorder records Fatalf's message and ends its goroutine, as
// testing.T's Fatalf does.
type fatalRecorder struct {
	*testing.T
	fatal *string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	*r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
