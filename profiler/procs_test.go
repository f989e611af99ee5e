package profiler

import (
	"os"
	"slices"
	"testing"
	"time"
)

// TestNoteAsksForPythonOnce: an allocation of a process not registered as
// Python has it looked at once until the look is done; one whose
// interpreter was starting is left for notReadyRetry, not looked at again
// at every event; frees never ask. Nothing of it is kept once it is
// dropped.
func TestNoteAsksForPythonOnce(t *testing.T) {
	p := bareProfiler(t, func(p *Profiler) { p.procs.reading.run = func() {} }) // asked, never reading
	procs := p.procs
	asked := func() bool {
		t.Helper()
		if len(procs.pyAsked) > 1 {
			t.Errorf("asked for %v, want once", procs.pyAsked)
		}
		ok := slices.Contains(procs.pyAsked, 7)
		procs.pyAsked, procs.pids[7].pyAsked = nil, false
		return ok
	}
	if procs.note(7, "python3", notedRelease); asked() {
		t.Error("a free asked for Python")
	}
	procs.note(7, "python3", notedAllocation)
	procs.note(7, "python3", notedAllocation)
	if !asked() {
		t.Error("an allocation did not ask for Python")
	}
	procs.pids[7].notReady = time.Now().Add(time.Hour)
	if procs.note(7, "python3", notedAllocation); asked() {
		t.Error("asked again while the interpreter was starting")
	}
	procs.pids[7].notReady = time.Now().Add(-time.Millisecond)
	if procs.note(7, "python3", notedAllocation); !asked() {
		t.Error("not asked again once the wait was over")
	}
	if procs.exited(7); !procs.pids[7].notReady.IsZero() {
		t.Errorf("kept after the exit: %v", procs.pids[7].notReady)
	}
	if procs.drop(7); len(procs.pids) != 0 {
		t.Errorf("kept after the drop: %+v", procs.pids)
	}
}

// TestNoteKeepsCommOfTensorFrees: a tensor free's record has no comm; the
// one the process's allocations carried stays, and a renamed process
// takes its new one.
func TestNoteKeepsCommOfTensorFrees(t *testing.T) {
	p := bareProfiler(t, func(p *Profiler) { p.procs.reading.run = func() {} })
	procs := p.procs
	comm := func() string { return procs.pids[7].proc.Comm }
	procs.note(7, "python3", notedAllocation)
	if procs.note(7, "", notedRelease); comm() != "python3" {
		t.Errorf("after a tensor free: comm %q, want python3", comm())
	}
	if procs.note(7, "pt_main_thread", notedAllocation); comm() != "pt_main_thread" {
		t.Errorf("renamed: comm %q, want pt_main_thread", comm())
	}
}

// TestNoteNamesProcessWithoutComm: a tensor allocation's record has no
// comm; a process first seen by one (the agent started after its driver
// calls) takes its comm from /proc as it is noted.
func TestNoteNamesProcessWithoutComm(t *testing.T) {
	p := bareProfiler(t, func(p *Profiler) { p.procs.reading.run = func() {} })
	procs := p.procs
	pid := uint32(os.Getpid())
	want := readComm("/proc", pid)
	if want == "" {
		t.Fatal("no comm in /proc for this test")
	}
	procs.note(pid, "", notedAllocation)
	if got := procs.pids[pid].proc.Comm; got != want {
		t.Errorf("comm %q, want %q", got, want)
	}
}
