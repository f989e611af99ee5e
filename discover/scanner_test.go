package discover

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
)

// fakeProcs is a /proc of processes written by the test, read by a Scanner
// whose boot clock the test sets.
type fakeProcs struct {
	t    testing.TB
	root string
	now  time.Duration
	s    *Scanner
}

func newFakeProcs(t testing.TB, driver string) *fakeProcs {
	f := &fakeProcs{t: t, root: t.TempDir()}
	f.s = NewScanner(f.root, driver)
	f.s.clock = func() (time.Duration, error) { return f.now, nil }
	return f
}

// fakeProc is what a process's stat and maps say.
type fakeProc struct {
	comm  string
	start time.Duration // since boot
	vsize uint64
	code  uint64
	maps  []string
	// thread: the ID of a thread other than its process's first, whose
	// stat /proc shows at that ID too.
	thread bool
}

// write writes process pid's stat, as the kernel writes it, and maps.
func (f *fakeProcs) write(pid int, p fakeProc) {
	f.t.Helper()
	fields := slices.Repeat([]string{"0"}, 50) // fields 3 to 52 of proc(5)
	fields[0] = "S"
	fields[22-3] = strconv.FormatInt(int64(p.start/(time.Second/userHZ)), 10)
	fields[23-3] = strconv.FormatUint(p.vsize, 10)
	fields[26-3] = strconv.FormatUint(p.code, 10)
	if p.thread {
		fields[38-3] = "-1" // exit_signal
	}
	stat := fmt.Sprintf("%d (%s) %s\n", pid, p.comm, strings.Join(fields, " "))
	dir := filepath.Join(f.root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
		f.t.Fatal(err)
	}
	maps := strings.Join(p.maps, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "maps"), []byte(maps), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// ownNamespace makes the fake /proc the scanner's own PID namespace's (its
// self is this process), whose loadavg tells the last PID handed out: it
// returns the function that sets that PID.
func (f *fakeProcs) ownNamespace() (handedOut func(pid int)) {
	f.t.Helper()
	if err := os.Symlink(strconv.Itoa(os.Getpid()), filepath.Join(f.root, "self")); err != nil {
		f.t.Fatal(err)
	}
	return func(pid int) {
		f.t.Helper()
		if err := os.WriteFile(filepath.Join(f.root, "loadavg"), fmt.Appendf(nil, "0.00 0.01 0.05 1/120 %d\n", pid), 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
}

// scanAt scans at time at and checks the IDs of the libraries found and
// the Python processes.
func (f *fakeProcs) scanAt(at time.Duration, pids []int, libs []string, python []int) {
	f.t.Helper()
	f.now = at
	r, err := f.s.Scan(pids)
	if err != nil {
		f.t.Fatalf("at %v: %v", at, err)
	}
	var ids []string
	for _, l := range r.Libraries {
		ids = append(ids, l.ID())
	}
	if !slices.Equal(ids, libs) || !slices.Equal(r.Python, python) {
		f.t.Errorf("at %v: libraries %v, Python %v; want %v, %v", at, ids, r.Python, libs, python)
	}
}

const (
	driverLine    = "7f00-7f10 r-xp 00000000 fd:01 100 /a/libcuda.so.1"
	allocatorLine = "7f20-7f30 r-xp 00000000 fd:01 200 /a/libc10_cuda.so"
	pythonLine    = "7f40-7f50 r-xp 00000000 fd:01 300 /usr/bin/python3.12"
)

// TestScannerOneDriver: limited to one driver library, a scan finds the
// allocators and interpreters of the processes that map it, and leaves
// those of a process on another driver alone.
func TestScannerOneDriver(t *testing.T) {
	for _, tc := range []struct {
		driver string
		libs   []string
		python []int
	}{
		{Library{Dev: "fd:01", Inode: 100}.ID(), []string{"fd:01/100", "fd:01/200"}, []int{10}},
		{"", []string{"fd:01/100", "fd:01/200", "fd:01/101", "fd:01/201"}, []int{10, 11}},
	} {
		f := newFakeProcs(t, tc.driver)
		f.write(10, fakeProc{comm: "python3", maps: []string{driverLine, allocatorLine, pythonLine}})
		f.write(11, fakeProc{comm: "python3", maps: []string{
			"7f00-7f10 r-xp 00000000 fd:01 101 /b/libcuda.so.1",
			"7f20-7f30 r-xp 00000000 fd:01 201 /b/libc10_cuda.so",
			pythonLine,
		}})
		f.write(12, fakeProc{comm: "sleep", maps: []string{"7f00-7f10 r-xp 00000000 fd:01 400 /usr/lib/libc.so.6"}})
		f.scanAt(time.Minute, nil, tc.libs, tc.python)
	}
}

// TestScannerReadsMapsWhenStatChanges: a process's maps are read when it
// is first seen; then its stat only, a tenth of its age later, and its
// maps again only when the stat changed.
func TestScannerReadsMapsWhenStatChanges(t *testing.T) {
	f := newFakeProcs(t, "")
	p := fakeProc{comm: "python3", start: 100 * time.Second, vsize: 1 << 20, code: 0x5000, maps: []string{pythonLine}}
	f.write(10, p)
	f.scanAt(200*time.Second, nil, nil, []int{10}) // 100 s old: looked at again at 210 s

	p.maps = append(p.maps, driverLine) // a change its stat does not show
	f.write(10, p)
	f.scanAt(209*time.Second, nil, nil, []int{10})
	f.scanAt(210*time.Second, nil, nil, []int{10}) // its stat read, the same: next look at 221 s

	p.vsize += 4096
	f.write(10, p)
	f.scanAt(220*time.Second, nil, nil, []int{10})
	f.scanAt(221*time.Second, nil, []string{"fd:01/100"}, []int{10})
}

// TestScannerWaits: a process is looked at after a tenth of its program's
// age, at most maxWait.
func TestScannerWaits(t *testing.T) {
	f := newFakeProcs(t, "")
	f.write(10, fakeProc{comm: "young", start: 999 * time.Second})
	f.write(11, fakeProc{comm: "grown", start: 900 * time.Second})
	f.write(12, fakeProc{comm: "old", start: 0})
	f.scanAt(1000*time.Second, nil, nil, nil)
	for pid, want := range map[int]time.Duration{
		10: 1000*time.Second + 100*time.Millisecond,
		11: 1000*time.Second + 10*time.Second,
		12: 1000*time.Second + maxWait,
	} {
		if got := f.s.procs[pid].due; got != want {
			t.Errorf("pid %d: next look at %v, want %v", pid, got, want)
		}
	}
}

// TestScannerSeesExec: a program that replaces its process (another comm
// or text) has its maps read and is looked at as a program starting: at
// the next scan again.
func TestScannerSeesExec(t *testing.T) {
	f := newFakeProcs(t, "")
	p := fakeProc{comm: "sh", start: 0, vsize: 1 << 20, code: 0x5000}
	f.write(10, p)
	f.scanAt(1000*time.Second, nil, nil, nil) // next look at 1030 s

	p.comm, p.code, p.maps = "python3", 0x7000, []string{pythonLine}
	f.write(10, p)
	f.scanAt(1030*time.Second, nil, nil, []int{10})
	p.maps, p.vsize = append(p.maps, allocatorLine), p.vsize+4096
	f.write(10, p)
	f.scanAt(1030*time.Second+500*time.Millisecond, nil, []string{"fd:01/200"}, []int{10})
}

// TestScannerSeesPIDTaken: a PID taken by another process (another start
// time) is a new process, its maps read, whatever its stat says else.
func TestScannerSeesPIDTaken(t *testing.T) {
	f := newFakeProcs(t, "")
	p := fakeProc{comm: "python3", start: 0, vsize: 1 << 20, maps: []string{pythonLine}}
	f.write(10, p)
	f.scanAt(1000*time.Second, nil, nil, []int{10})
	p.start, p.maps = 999*time.Second, []string{driverLine}
	f.write(10, p)
	f.scanAt(1030*time.Second, nil, []string{"fd:01/100"}, nil)
}

// TestScannerForgetsExited: a process gone is forgotten, whether all
// processes are scanned or those asked for.
func TestScannerForgetsExited(t *testing.T) {
	for _, pids := range [][]int{nil, {10, 11}} {
		f := newFakeProcs(t, "")
		f.write(10, fakeProc{comm: "python3", maps: []string{pythonLine}})
		f.write(11, fakeProc{comm: "python3", maps: []string{pythonLine}})
		f.scanAt(1000*time.Second, pids, nil, []int{10, 11})
		if err := os.RemoveAll(filepath.Join(f.root, "10")); err != nil {
			t.Fatal(err)
		}
		f.scanAt(1000*time.Second+500*time.Millisecond, pids, nil, []int{11})
		if _, ok := f.s.procs[10]; ok || len(f.s.procs) != 1 {
			t.Errorf("pids %v: %d processes known, want process 11 alone", pids, len(f.s.procs))
		}
	}
}

// TestScannerCalling: a process the tracer saw call the driver is looked
// at at the next scan, once; a program started after in it, once again.
func TestScannerCalling(t *testing.T) {
	f := newFakeProcs(t, "")
	p := fakeProc{comm: "python3", start: 0, vsize: 1 << 20, code: 0x5000, maps: []string{pythonLine}}
	f.write(10, p)
	f.scanAt(1000*time.Second, nil, nil, []int{10}) // next look at 1030 s
	p.maps, p.vsize = append(p.maps, driverLine, allocatorLine), p.vsize+4096
	f.write(10, p)
	f.s.Calling(10)
	f.s.Calling(11) // not known: nothing to bring forward
	f.scanAt(1001*time.Second, nil, []string{"fd:01/100", "fd:01/200"}, []int{10})

	p.maps, p.vsize = []string{pythonLine}, p.vsize+4096
	f.write(10, p)
	f.s.Calling(10) // once only: its look stays at 1001 s + maxWait
	f.scanAt(1002*time.Second, nil, []string{"fd:01/100", "fd:01/200"}, []int{10})

	p.comm, p.code = "python3.12", 0x6000 // an exec, seen at its look
	f.write(10, p)
	f.scanAt(1001*time.Second+maxWait, nil, nil, []int{10})
	f.s.Calling(10)
	if due := f.s.procs[10].due; due != 0 {
		t.Errorf("the new program's call did not bring its look forward: due at %v", due)
	}
}

func TestParseStat(t *testing.T) {
	kthread := "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 9 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 1 0 0 0 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
	odd := "8866 (a) b (c) R 8864 8864 24744 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 822680 3133440 390 18446744073709551615 94385441406976 94385441426857 140732767618592 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 94385441442864 94385441444480 94386512162816 140732767623859 140732767623879 140732767623879 140732767625195 0\n"
	for _, tc := range []struct {
		data  string
		comm  string
		start time.Duration
		vsize uint64
		code  uint64
		ok    bool
	}{
		{kthread, "kthreadd", 90 * time.Millisecond, 0, 0, true},
		{odd, "a) b (c", 8226800 * time.Millisecond, 3133440, 94385441406976, true},
		{"8866 (cat) R 8864", "", 0, 0, 0, false},
		{"8866 cat R 8864 8864 24744 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 822680 3133440 390 1 2 3 4", "", 0, 0, 0, false},
		{strings.Replace(kthread, " 9 0 0 ", " 9 x 0 ", 1), "", 0, 0, 0, false},
	} {
		st, err := parseStat([]byte(tc.data))
		want := stat{start: tc.start, vsize: tc.vsize}
		want.program.comm, want.program.code = tc.comm, tc.code
		if (err == nil) != tc.ok || tc.ok && st != want {
			t.Errorf("%q: %+v %v, want %+v", tc.data, st, err, want)
		}
	}
	data := []byte(odd)
	if n := testing.AllocsPerRun(100, func() { parseStat(data) }); n != 1 {
		t.Errorf("%v allocations a parse, want 1 (the comm)", n)
	}
	// This process's own stat, as the kernel writes it.
	st, _, err := NewScanner("/proc", "").readStat(os.Getpid(), nil)
	if err != nil || st.vsize == 0 || st.program.code == 0 || st.program.comm == "" || st.thread {
		t.Errorf("own stat: %+v %v", st, err)
	}
	// Another of its threads (the Go runtime starts several), at its own ID.
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if task.Name() == strconv.Itoa(os.Getpid()) {
			continue
		}
		tid, _ := strconv.Atoi(task.Name())
		if st, _, err := NewScanner("/proc", "").readStat(tid, nil); err == nil && !st.thread {
			t.Errorf("thread %d: %+v, not a thread", tid, st)
		}
		break
	}
}

// TestScannerFindsLateLibrary: real processes. A shell is seen, then
// replaced by Python (exec), which maps a driver library file a moment
// later: the scans, as the profiler makes them, find the interpreter and
// then the library while the program is young, through the process's stat
// file held open from the first look; closed once the process is gone.
func TestScannerFindsLateLibrary(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libcuda.so.1")
	if err := os.WriteFile(lib, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	script := `import mmap, sys
sys.stdin.readline()
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
print("mapped", flush=True)
sys.stdin.readline()`
	cmd := exec.Command("sh", "-c", `echo ready; read line; exec python3 -c "$0" "$1"`, script, lib)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	said := func(want string) {
		t.Helper()
		if !lines.Scan() || lines.Text() != want {
			t.Fatalf("process said %q, want %q", lines.Text(), want)
		}
	}
	said("ready")
	pid := cmd.Process.Pid
	s := NewScanner("/proc", "")
	scanUntil := func(what string, found func(Result) bool) {
		t.Helper()
		waitfor.Value(t, what, 10*time.Second, func() Result {
			r, err := s.Scan([]int{pid})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}, found)
	}
	if r, err := s.Scan([]int{pid}); err != nil || len(r.Python) != 0 || len(r.Libraries) != 0 {
		t.Fatalf("the shell: %+v %v", r, err)
	}
	fmt.Fprintln(stdin)
	scanUntil("Python", func(r Result) bool { return slices.Equal(r.Python, []int{pid}) })
	fmt.Fprintln(stdin)
	said("mapped")
	want, err := FileID(lib)
	if err != nil {
		t.Fatal(err)
	}
	scanUntil("the library", func(r Result) bool {
		return len(r.Libraries) == 1 && r.Libraries[0].ID() == want &&
			r.Libraries[0].Path == filepath.Join("/proc", strconv.Itoa(pid), "root", lib)
	})
	if s.held != 1 {
		t.Errorf("%d stat files held, want the process's", s.held)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if r, err := s.Scan([]int{pid}); err != nil || len(r.Python)+len(r.Libraries) != 0 || s.held != 0 {
		t.Errorf("the process gone: %+v %v, %d stat files held", r, err, s.held)
	}
}

// TestHeldStatOfExitedProcess: a stat file held open reads its process
// again, and fails once that is gone, even when its PID is listed still.
func TestHeldStatOfExitedProcess(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	buf := make([]byte, listBuffer)
	fd, _, err := openFileOf("/proc", cmd.Process.Pid, "stat", buf)
	if err != nil {
		t.Fatal(err)
	}
	if data := readAt0(fd, buf); !bytes.HasPrefix(data, fmt.Appendf(nil, "%d (sleep) ", cmd.Process.Pid)) {
		t.Errorf("read again: %q", data)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if data := readAt0(fd, buf); data != nil {
		t.Errorf("read after the process exited: %q, want none", data)
	}
	s := NewScanner("/proc", "")
	p := &process{statFD: fd} // closed by the read that fails
	s.held = 1
	if _, fd, err := s.readStat(cmd.Process.Pid, p); err == nil || fd != -1 || s.held != 0 || p.statFD != -1 {
		t.Errorf("stat of the exited process: %v, file %d, %d held", err, fd, s.held)
	}
}

// TestScannerAddsPIDsHandedOut: a few PIDs handed out since the last
// listing are added one by one: those of processes found, those of threads
// and of processes gone dropped; more than maxProbed, or maxWait after the
// last listing, /proc is listed again, which finds a PID handed out of
// turn.
func TestScannerAddsPIDsHandedOut(t *testing.T) {
	f := newFakeProcs(t, "")
	handedOut := f.ownNamespace()
	python := fakeProc{comm: "python3", maps: []string{pythonLine}}
	f.write(10, python)
	handedOut(10)
	f.scanAt(1000*time.Second, nil, nil, []int{10})

	f.write(11, python)
	f.write(12, fakeProc{comm: "python3", maps: []string{pythonLine}, thread: true})
	f.write(5, python) // out of turn
	handedOut(13)      // 13: a process already gone
	f.scanAt(1000*time.Second+500*time.Millisecond, nil, nil, []int{10, 11})
	if !slices.Equal(f.s.pids, []int{10, 11}) || len(f.s.procs) != 2 {
		t.Errorf("listing %v, %d processes known: want 10 and 11", f.s.pids, len(f.s.procs))
	}

	f.write(13+maxProbed+1, python)
	handedOut(13 + maxProbed + 1)
	f.scanAt(1001*time.Second, nil, nil, []int{5, 10, 11, 13 + maxProbed + 1})

	f.write(6, python) // out of turn
	f.scanAt(1001*time.Second+maxWait-time.Millisecond, nil, nil, []int{5, 10, 11, 13 + maxProbed + 1})
	f.scanAt(1001*time.Second+maxWait, nil, nil, []int{5, 6, 10, 11, 13 + maxProbed + 1})
}

// TestListPIDs: the processes of /proc, and the numeric names of a
// directory only.
func TestListPIDs(t *testing.T) {
	pids, err := listPIDs("/proc", make([]byte, 256), nil) // a few records a call
	if err != nil || !slices.Contains(pids, 1) || !slices.Contains(pids, os.Getpid()) {
		t.Errorf("/proc: %d processes, %v; want 1 and %d among them", len(pids), err, os.Getpid())
	}
	root := t.TempDir()
	for _, name := range []string{"10", "self", "0", "1x", "-3", "99999999999999999999999", "12"} {
		if err := os.Mkdir(filepath.Join(root, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "uptime"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	pids, err = listPIDs(root, make([]byte, listBuffer), []int{7})
	slices.Sort(pids)
	if err != nil || !slices.Equal(pids, []int{7, 10, 12}) {
		t.Errorf("%v %v, want [7 10 12]", pids, err)
	}
	if _, err := listPIDs(filepath.Join(root, "none"), make([]byte, listBuffer), nil); err == nil {
		t.Error("no error listing a directory that does not exist")
	}
}

// TestScannerListsWhenAPIDWasHandedOut: on a /proc of the scanner's own
// PID namespace, a scan lists the processes only when the kernel handed
// out a PID since the last listing (loadavg's last field): a process that
// appears without one is not listed (it cannot: none was made), one made
// with one is; a process gone is forgotten at its next look without a
// listing.
func TestScannerListsWhenAPIDWasHandedOut(t *testing.T) {
	f := newFakeProcs(t, "")
	handedOut := f.ownNamespace()
	handedOut(11)
	f.write(10, fakeProc{comm: "python3", maps: []string{pythonLine}})
	f.write(11, fakeProc{comm: "python3", start: 999 * time.Second, maps: []string{pythonLine}})
	f.scanAt(1000*time.Second, nil, nil, []int{10, 11})
	f.write(12, fakeProc{comm: "python3", start: 1000 * time.Second, maps: []string{pythonLine}})
	f.scanAt(1000*time.Second+500*time.Millisecond, nil, nil, []int{10, 11})
	handedOut(12)
	f.scanAt(1001*time.Second, nil, nil, []int{10, 11, 12})
	if err := os.RemoveAll(filepath.Join(f.root, "11")); err != nil {
		t.Fatal(err)
	}
	// Process 11, 2 s old at its last look, is due 0.2 s after it.
	f.scanAt(1001*time.Second+100*time.Millisecond, nil, nil, []int{10, 11, 12})
	f.scanAt(1001*time.Second+300*time.Millisecond, nil, nil, []int{10, 12})
	if !slices.Equal(f.s.pids, []int{10, 12}) || len(f.s.procs) != 2 {
		t.Errorf("listing %v, %d processes known: want 10 and 12", f.s.pids, len(f.s.procs))
	}
}
