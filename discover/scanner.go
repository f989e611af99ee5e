package discover

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// maxWait is the longest a process is left between two looks at it: a
// library a process loads after hours idle is found within this.
const maxWait = 30 * time.Second

// userHZ is the unit of /proc/PID/stat's times: USER_HZ, 100 on every
// architecture gpu-mem runs on (x86-64, arm64).
const userHZ = 100

// Scanner finds what Scan finds, at each call, at a cost that follows the
// processes that start and change rather than those that exist: reading a
// process's maps takes its mmap lock (page faults of a training process
// wait behind it) and costs tens of microseconds, so a node of a thousand
// idle processes read in full twice a second spends a fifth of a core on
// nothing.
//
// A process is known by its PID and start time. Its maps are read when it
// is first seen, and again only when its stat says they may have changed:
// another size of its address space (a library loaded or unloaded maps or
// unmaps) or another program (an exec). Its stat is read at each scan while
// its program is young, then less and less often: a tenth of the program's
// age after each look, at most maxWait; so a library loaded at age A is
// found by about 1.1 A, and a program that runs for hours costs one small
// read every maxWait. Calling brings a process's next look forward.
//
// A Scanner is for one goroutine at a time.
type Scanner struct {
	procRoot string
	driver   string // Library.ID of the one driver whose processes count; "" for any
	clock    func() (time.Duration, error)
	scans    uint64
	procs    map[int]*process
	buf      []byte // for listing /proc and reading stat files
	pids     []int  // the last listing, less the processes seen gone since
	// lastPID is the PID the kernel had handed out last at the last
	// listing (lastPID), -1 when unknown.
	lastPID int
}

// process is what a Scanner knows of one process.
type process struct {
	stat   stat          // as at the last look
	since  time.Duration // its program's start: the process's, or its exec seen
	due    time.Duration // when to look again
	libs   []Library
	python bool
	called bool   // Calling brought a look forward once (since the program started)
	listed uint64 // the last scan that found it
}

// NewScanner scans the processes under procRoot, of those that map the
// driver library with this ID (Library.ID) only, or of all when driver is
// empty: a profiler limited to one driver library (--library) leaves the
// allocators and interpreters of processes on another driver alone.
func NewScanner(procRoot, driver string) *Scanner {
	return &Scanner{procRoot: procRoot, driver: driver, clock: bootClock, procs: map[int]*process{}, buf: make([]byte, listBuffer), lastPID: -1}
}

// bootClock is the time since boot, the clock of /proc/PID/stat's start
// times (CLOCK_BOOTTIME: suspended time counts, as in a process's start).
func bootClock() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, fmt.Errorf("read the boot clock: %w", err)
	}
	return time.Duration(ts.Nano()), nil
}

// Scan finds the libraries and Python processes among the given processes
// (all of procRoot when pids is empty), reading the files of those new,
// changed or due. Processes gone are forgotten.
func (s *Scanner) Scan(pids []int) (Result, error) {
	now, err := s.clock()
	if err != nil {
		return Result{}, err
	}
	all := len(pids) == 0
	if all {
		if pids, err = s.listing(); err != nil {
			return Result{}, err
		}
	} else {
		pids = s.existing(pids)
	}
	s.scans++
	there := pids[:0]
	for _, pid := range pids {
		if s.look(pid, now) {
			there = append(there, pid)
		}
	}
	if all {
		s.pids = there
	}
	s.forgetUnlisted()
	return s.result(), nil
}

// listing lists the processes of procRoot; or, when the kernel handed out
// no PID since the last listing (no process or thread was made: an idle
// node, most scans), the last listing again, whose processes gone since
// are found so at their next look. A /proc of another PID namespace than
// the scanner's own is listed every time: its last PID is not the one its
// loadavg says.
func (s *Scanner) listing() ([]int, error) {
	last := lastPID(s.procRoot, s.buf)
	if last >= 0 && last == s.lastPID {
		return s.pids, nil
	}
	pids, err := listPIDs(s.procRoot, s.buf, s.pids[:0])
	if err != nil {
		s.lastPID = -1
		return nil, err
	}
	s.pids, s.lastPID = pids, last
	return pids, nil
}

// Calling says that process pid calls the driver (the tracer saw it
// allocate): it is looked at again at the next scan, once per program, to
// find the libraries it loaded before its first call (PyTorch's
// allocator) without waiting for its next look.
func (s *Scanner) Calling(pid int) {
	if p := s.procs[pid]; p != nil && !p.called {
		p.called, p.due = true, 0
	}
}

// existing are those of pids that exist: a process asked for that exited
// is forgotten as one that is no longer listed.
func (s *Scanner) existing(pids []int) []int {
	var live []int
	for _, pid := range pids {
		if _, err := os.Stat(filepath.Join(s.procRoot, strconv.Itoa(pid))); !errors.Is(err, fs.ErrNotExist) {
			live = append(live, pid)
		}
	}
	return live
}

// look looks at process pid if it is new or due: its stat, and its maps
// when the stat says they may have changed. The stat is read before the
// maps, so that a change between the two reads is seen at the next look.
// It says whether the process is there still, as far as it knows.
func (s *Scanner) look(pid int, now time.Duration) bool {
	p := s.procs[pid]
	if p != nil {
		p.listed = s.scans
		if now < p.due {
			return true
		}
	}
	st, err := s.readStat(pid)
	if err != nil {
		delete(s.procs, pid) // exited; or unreadable, and tried again as new at the next listing
		return false
	}
	switch {
	case p == nil || st.start != p.stat.start: // new, or its PID taken by another
		p = &process{since: st.start}
		s.procs[pid] = p
		p.libs, p.python = scanProcess(s.procRoot, pid)
	case st.program != p.stat.program: // exec: a program starting, to look at as young
		p.since, p.called = now, false
		p.libs, p.python = scanProcess(s.procRoot, pid)
	case st.vsize != p.stat.vsize: // mapped or unmapped something: a library, or memory
		p.libs, p.python = scanProcess(s.procRoot, pid)
	}
	p.stat, p.listed = st, s.scans
	p.due = now + min((now-p.since)/10, maxWait)
	return true
}

// forgetUnlisted forgets the processes the last scan did not find.
func (s *Scanner) forgetUnlisted() {
	for pid, p := range s.procs {
		if p.listed != s.scans {
			delete(s.procs, pid)
		}
	}
}

// result is what the processes known map, in the order of their PIDs.
func (s *Scanner) result() Result {
	var pids []int
	for pid, p := range s.procs {
		if len(p.libs) > 0 || p.python {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	c := newCollector(s.driver)
	for _, pid := range pids {
		c.add(pid, s.procs[pid].libs, s.procs[pid].python)
	}
	return c.r
}

// stat is what /proc/PID/stat says of a process that tells whether its
// maps may have changed. The kernel writes these fields (fs/proc/array.c,
// do_task_stat) from the mm's counters without taking its mmap lock:
// reading them never holds up the process, where reading its maps does.
type stat struct {
	start time.Duration // since boot: with the PID, the process's identity
	// program changes with an exec: the name (comm) and where the program's
	// text starts (startcode; randomized for position-independent programs).
	program struct {
		comm string
		code uint64
	}
	vsize uint64 // bytes mapped: changes with every mmap and munmap
}

func (s *Scanner) readStat(pid int) (stat, error) {
	data, err := readFileOf(s.procRoot, pid, "stat", s.buf)
	if err != nil {
		return stat{}, err
	}
	st, err := parseStat(data)
	if err != nil {
		return stat{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st, nil
}

// errStat is a stat file that does not read as the kernel writes one.
var errStat = errors.New("malformed /proc/PID/stat")

// parseStat reads "pid (comm) state ppid ...": comm may hold spaces and
// parentheses, so the fields are counted from the last ')'. It allocates
// the comm alone: a scan parses hundreds of stat files a second.
func parseStat(data []byte) (stat, error) {
	open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if open < 0 || end < open {
		return stat{}, errStat
	}
	var st stat
	var start uint64
	rest := data[end+1:]
	for field := 3; field <= 26; field++ { // the fields of proc(5) after comm
		var f []byte
		if f, rest = nextField(rest); f == nil {
			return stat{}, fmt.Errorf("%w: %d fields", errStat, field-1)
		}
		var to *uint64
		switch field {
		case 22: // starttime, in clock ticks after boot
			to = &start
		case 23:
			to = &st.vsize
		case 26: // startcode
			to = &st.program.code
		default:
			continue
		}
		var ok bool
		if *to, ok = decimal(f); !ok {
			return stat{}, fmt.Errorf("%w: field %d is %q", errStat, field, f)
		}
	}
	st.program.comm = string(data[open+1 : end])
	if start > math.MaxInt64/uint64(time.Second/userHZ) { // 292 years after boot
		return stat{}, fmt.Errorf("%w: start time %d ticks", errStat, start)
	}
	st.start = time.Duration(start) * (time.Second / userHZ)
	return st, nil
}

// nextField splits the space-separated field at the start of b from what
// follows; nil when none is left.
func nextField(b []byte) (field, rest []byte) {
	b = bytes.TrimLeft(b, " \n")
	if len(b) == 0 {
		return nil, nil
	}
	if i := bytes.IndexAny(b, " \n"); i >= 0 {
		return b[:i], b[i:]
	}
	return b, nil
}
