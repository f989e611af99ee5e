package tests

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/tracer"
)

// TestKilledInsideTheDriverLeavesNothing: a process killed while one of its
// threads is inside cuMemAlloc_v2 leaves no call in flight behind.
func TestKilledInsideTheDriverLeavesNothing(t *testing.T) {
	tr, err := tracer.New(tracer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if _, err := tr.Attach(simLib); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(simwork, "hold", "777")
	cmd.Env = append(cmd.Environ(), "SIMCUDA_HANG_BYTES=777", "SIMWORK_NOWAIT=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitInFlight(t, tr, 1)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	waitInFlight(t, tr, 0)
}

func waitInFlight(t *testing.T, tr *tracer.Tracer, want int) {
	t.Helper()
	deadline := time.Now().Add(hangLimit)
	for {
		n, err := tr.InFlight()
		if err != nil {
			t.Fatal(err)
		}
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls in flight, want %d", n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
