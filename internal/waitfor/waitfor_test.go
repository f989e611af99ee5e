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
