package tracer

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
)

// TestSleepingReaderWoken: a reader that found the ring buffer empty for a
// while sleeps (reader_asleep set), and the next event wakes it at once,
// clearing the flag, instead of the sleep's bound doing.
func TestSleepingReaderWoken(t *testing.T) {
	w := startTraced(t, nil, "kinds")
	read := make(chan error, 1)
	go func() {
		var ev Event
		read <- w.tr.Read(&ev)
	}()
	asleep := loadedMap(t, w.tr, "reader_asleep")
	flag := func() uint32 {
		var v uint32
		if err := asleep.Lookup(uint32(0), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	waitfor.Value(t, "the reader asleep", 2*asleepWait, flag, func(v uint32) bool { return v == 1 })
	sent := time.Now()
	fmt.Fprintln(w.stdin) // the workload's first event
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(asleepWait / 2):
		t.Fatalf("no event read %v after it was sent: the reader was not woken", asleepWait/2)
	}
	if v := flag(); v != 0 {
		t.Errorf("reader_asleep is %d after the event that woke the reader, want 0", v)
	}
	t.Logf("read %v after the event was sent", time.Since(sent))
}
