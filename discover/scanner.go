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

// maxProbed is the most PIDs handed out since the last listing that a
// listing adds one by one rather than list /proc again (listing).
const maxProbed = 64

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
// On a real procfs, a process's stat file is held open from its first look
// and read again in place: opening walks the path through /proc, and costs
// two to five times the read (BenchmarkReadStat), most of an idle node's
// scan. A held file reads its own process or fails (ESRCH) once that has
// exited, so a PID taken by another is opened afresh.
//
// A Scanner is for one goroutine at a time; Close closes the files it
// holds.
type Scanner struct {
	procRoot string
	driver   string // Library.ID of the one driver whose processes count; "" for any
	clock    func() (time.Duration, error)
	scans    uint64
	procs    map[int]*process
	buf      []byte // for listing /proc and reading stat files
	pids     []int  // the last listing, less the processes seen gone since
	// lastPID is the PID the kernel had handed out last at the last
	// listing (lastPID), -1 when unknown; listedAt is when /proc was last
	// listed in full.
	lastPID  int
	listedAt time.Duration
	// loadavg is procRoot's loadavg held open (openLoadavg), opened at the
	// first listing; -1 when it does not tell the last PID.
	loadavg       int
	loadavgOpened bool
	held          int // stat files held open
	// maxHeld is how many at most: a quarter of the files the agent may
	// open, the rest left to its probes, maps and connections; none but on
	// a real procfs, whose files of an exited process fail to read (a
	// test's tree does not).
	maxHeld int
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
	statFD int    // its stat file held open, -1 for none
}

// NewScanner scans the processes under procRoot, of those that map the
// driver library with this ID (Library.ID) only, or of all when driver is
// empty: a profiler limited to one driver library (--library) leaves the
// allocators and interpreters of processes on another driver alone.
func NewScanner(procRoot, driver string) *Scanner {
	return &Scanner{
		procRoot: procRoot, driver: driver, clock: bootClock, procs: map[int]*process{}, buf: make([]byte, listBuffer), lastPID: -1, loadavg: -1,
		maxHeld: heldAtMost(procRoot),
	}
}

// heldAtMost is how many stat files a scanner of procRoot holds open.
func heldAtMost(procRoot string) int {
	if !isProcfs(procRoot) {
		return 0
	}
	return quarterOfFileLimit()
}

// isProcfs says whether dir is a mounted procfs.
func isProcfs(dir string) bool {
	var fs unix.Statfs_t
	return unix.Statfs(dir, &fs) == nil && fs.Type == unix.PROC_SUPER_MAGIC
}

// quarterOfFileLimit is a quarter of how many files this process may have
// open (RLIMIT_NOFILE, whose soft limit Go raises to the hard one).
func quarterOfFileLimit() int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	return int(min(lim.Cur/4, math.MaxInt32))
}

// Close closes the files the scanner holds open; a later Scan opens them
// again.
func (s *Scanner) Close() {
	for _, p := range s.procs {
		s.release(p)
	}
	if s.loadavg >= 0 {
		unix.Close(s.loadavg)
	}
	s.loadavg, s.loadavgOpened, s.lastPID = -1, false, -1
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
		if pids, err = s.listing(now); err != nil {
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
// are found so at their next look; or, when it handed out a few
// (maxProbed), the last listing with those PIDs added: the kernel hands
// PIDs out in turn, so a process made since has one of them, and look
// drops those of threads and of processes gone. Listing /proc costs a
// read of every process's entry, half a millisecond for a hundred on a
// virtual machine. It lists in full again at least every maxWait, for a
// PID handed out out of turn (a checkpoint restored), and every time for
// a /proc of another PID namespace than the scanner's own, whose last PID
// is not the one its loadavg says.
func (s *Scanner) listing(now time.Duration) ([]int, error) {
	if !s.loadavgOpened {
		s.loadavg, s.loadavgOpened = openLoadavg(s.procRoot), true
	}
	last := -1
	if s.loadavg >= 0 {
		last = lastPID(s.loadavg, s.buf)
	}
	if last >= 0 && s.lastPID >= 0 && now-s.listedAt < maxWait {
		switch handed := last - s.lastPID; {
		case handed == 0:
			return s.pids, nil
		case handed > 0 && handed <= maxProbed:
			for pid := s.lastPID + 1; pid <= last; pid++ {
				s.pids = append(s.pids, pid)
			}
			s.lastPID = last
			return s.pids, nil
		}
	}
	pids, err := listPIDs(s.procRoot, s.buf, s.pids[:0])
	if err != nil {
		s.lastPID = -1
		return nil, err
	}
	s.pids, s.lastPID, s.listedAt = pids, last, now
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
	st, fd, err := s.readStat(pid, p)
	if err != nil || st.thread {
		s.closeHeld(fd)
		delete(s.procs, pid) // exited; a thread's ID; or unreadable, and tried again as new at the next listing
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
	p.stat, p.listed, p.statFD = st, s.scans, fd
	p.due = now + min((now-p.since)/10, maxWait)
	return true
}

// forgetUnlisted forgets the processes the last scan did not find.
func (s *Scanner) forgetUnlisted() {
	for pid, p := range s.procs {
		if p.listed != s.scans {
			s.release(p)
			delete(s.procs, pid)
		}
	}
}

// release closes process p's stat file, if it is held.
func (s *Scanner) release(p *process) {
	s.closeHeld(p.statFD)
	p.statFD = -1
}

// closeHeld closes a held stat file; none when fd is -1.
func (s *Scanner) closeHeld(fd int) {
	if fd >= 0 {
		unix.Close(fd)
		s.held--
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
	// thread: a thread other than its process's first, whose ID /proc
	// opens but does not list (its exit_signal is -1).
	thread bool
}

// readStat reads process pid's stat: in its file held open, known as p,
// when there is one and its process is still there; else opened by its
// path, and held when the scanner holds files and has room. It returns the
// file held for pid now, -1 for none; on an error, none is.
func (s *Scanner) readStat(pid int, p *process) (stat, int, error) {
	var data []byte
	fd := -1
	if p != nil && p.statFD >= 0 {
		fd = p.statFD
		p.statFD = -1
		if data = readAt0(fd, s.buf); data == nil { // its process gone: the PID may be another's
			s.closeHeld(fd)
			fd = -1
		}
	}
	if fd < 0 {
		var err error
		if data, fd, err = s.openStat(pid); err != nil {
			return stat{}, -1, err
		}
	}
	st, err := parseStat(data)
	if err != nil {
		s.closeHeld(fd)
		return stat{}, -1, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st, fd, nil
}

// openStat reads process pid's stat by its path and returns its file when
// the scanner holds it, -1 when it closed it.
func (s *Scanner) openStat(pid int) ([]byte, int, error) {
	if s.held >= s.maxHeld {
		data, err := readFileOf(s.procRoot, pid, "stat", s.buf)
		return data, -1, err
	}
	fd, data, err := openFileOf(s.procRoot, pid, "stat", s.buf)
	if err != nil {
		return nil, -1, err
	}
	s.held++
	return data, fd, nil
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
	for field := 3; field <= 38; field++ { // the fields of proc(5) after comm
		var f []byte
		if f, rest = nextField(rest); f == nil {
			return stat{}, fmt.Errorf("%w: %d fields", errStat, field-1)
		}
		var to *uint64
		switch field {
		case 38: // exit_signal
			st.thread = string(f) == "-1"
			continue
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
