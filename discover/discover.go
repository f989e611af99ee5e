// Package discover finds the CUDA driver libraries mapped by running
// processes, wherever they live: the host, a pip wheel, a conda tree or a
// container's root file system.
package discover

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Library is one driver or allocator library file, identified by device and inode: the
// kernel attaches uprobes to an inode, so one attach covers every process
// that maps the same file, under whatever path.
type Library struct {
	Dev   string // major:minor as /proc/PID/maps prints it
	Inode uint64
	Path  string // a path that opens the file from this mount namespace
	// Allocator marks PyTorch's CUDA allocator library (libc10_cuda.so);
	// the others are the driver.
	Allocator bool
}

// ID is the identity under which a library is attached once.
func (l Library) ID() string { return l.Dev + "/" + strconv.FormatUint(l.Inode, 10) }

// FileID is the ID of the library file at path, as a process mapping it
// would show it.
func FileID(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	dev := fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev))
	return Library{Dev: dev, Inode: st.Ino}.ID(), nil
}

// IsDriverLibrary says whether a mapped file's path names the driver:
// libcuda.so, libcuda.so.1 or libcuda.so.<driver version>.
func IsDriverLibrary(path string) bool {
	base := filepath.Base(path)
	return base == "libcuda.so" || strings.HasPrefix(base, "libcuda.so.")
}

// IsAllocatorLibrary says whether a mapped file's path names PyTorch's
// CUDA caching allocator: libc10_cuda.so.
func IsAllocatorLibrary(path string) bool {
	return strings.HasPrefix(filepath.Base(path), "libc10_cuda.so")
}

// pythonFile matches the files that may hold a CPython runtime: the
// interpreter (python3.12) or its shared library (libpython3.12.so.1.0).
var pythonFile = regexp.MustCompile(`^(?:lib)?python(3\.\d+)`)

// PythonVersion returns the minor version ("3.12") of a mapped CPython
// interpreter or library, and false for any other file.
func PythonVersion(path string) (string, bool) {
	m := pythonFile.FindStringSubmatch(filepath.Base(path))
	if m == nil {
		return "", false
	}
	return m[1], true
}

// Result is what one scan found.
type Result struct {
	Libraries []Library // each driver and allocator library once
	Python    []int     // processes that map a CPython interpreter or library
}

// Scan reads /proc/PID/maps of the given processes (all of /proc when pids is
// empty), every one of them at each call: for a single look (one process's
// allocators), where a Scanner reads again only what changed. Processes that
// exit during the scan, or whose maps cannot be read, are skipped.
func Scan(procRoot string, pids []int) (Result, error) {
	if len(pids) == 0 {
		var err error
		if pids, err = listPIDs(procRoot, make([]byte, listBuffer), nil); err != nil {
			return Result{}, err
		}
	}
	c := newCollector("")
	for _, pid := range pids {
		libs, python := scanProcess(procRoot, pid)
		c.add(pid, libs, python)
	}
	return c.r, nil
}

// collector builds a Result from processes' libraries, each library once.
type collector struct {
	driver string // Library.ID of the one driver whose processes count; "" for any
	seen   map[string]bool
	r      Result
}

func newCollector(driver string) *collector {
	return &collector{driver: driver, seen: map[string]bool{}}
}

// add adds what process pid maps, unless it does not map the driver asked for.
func (c *collector) add(pid int, libs []Library, python bool) {
	if c.driver != "" && !slices.ContainsFunc(libs, func(l Library) bool { return l.ID() == c.driver }) {
		return
	}
	for _, lib := range libs {
		if !c.seen[lib.ID()] {
			c.seen[lib.ID()] = true
			c.r.Libraries = append(c.r.Libraries, lib)
		}
	}
	if python {
		c.r.Python = append(c.r.Python, pid)
	}
}

func scanProcess(procRoot string, pid int) (libs []Library, python bool) {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "maps"))
	if err != nil {
		return nil, false
	}
	return librariesIn(data, filepath.Join(procRoot, strconv.Itoa(pid), "root"))
}

// librariesIn reads the contents of a process's maps: the driver and
// allocator libraries it maps, at their paths under root (the process's
// root directory), and whether it maps a CPython interpreter.
func librariesIn(data []byte, root string) (libs []Library, python bool) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		m, ok := ParseMapsLine(sc.Text())
		if !ok || m.Deleted {
			continue
		}
		if _, ok := PythonVersion(m.Path); ok {
			python = true
		}
		allocator := IsAllocatorLibrary(m.Path)
		if !allocator && !IsDriverLibrary(m.Path) {
			continue
		}
		libs = append(libs, Library{
			Dev:       m.Dev,
			Inode:     m.Inode,
			Path:      underRoot(root, m.Path),
			Allocator: allocator,
		})
	}
	return libs, python
}

// underRoot is path as the process sees it, opened through its root
// directory: always under root, whatever ".." the path holds (the kernel
// writes none, but the path is read, not trusted).
func underRoot(root, path string) string {
	return filepath.Join(root, filepath.Clean("/"+path))
}

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End uint64
	Perms      string
	Offset     uint64
	Dev        string
	Inode      uint64
	Path       string
	Deleted    bool // the file was removed or replaced after it was mapped
}

// ParseMapsLine parses "start-end perms offset dev inode [path]". Path is
// empty for anonymous memory, and "[name]" for the kernel's ([stack], [vdso]).
func ParseMapsLine(line string) (Mapping, bool) {
	fields := strings.Fields(line)
	if len(fields) < 5 {
		return Mapping{}, false
	}
	start, end, ok := strings.Cut(fields[0], "-")
	if !ok {
		return Mapping{}, false
	}
	var m Mapping
	var err error
	if m.Start, err = strconv.ParseUint(start, 16, 64); err != nil {
		return Mapping{}, false
	}
	if m.End, err = strconv.ParseUint(end, 16, 64); err != nil {
		return Mapping{}, false
	}
	if m.Offset, err = strconv.ParseUint(fields[2], 16, 64); err != nil {
		return Mapping{}, false
	}
	if m.Inode, err = strconv.ParseUint(fields[4], 10, 64); err != nil {
		return Mapping{}, false
	}
	m.Perms = fields[1]
	m.Dev = fields[3]
	// Paths may contain spaces; the kernel appends " (deleted)".
	if len(fields) > 5 {
		m.Path = strings.Join(fields[5:], " ")
	}
	if p, found := strings.CutSuffix(m.Path, " (deleted)"); found {
		m.Path, m.Deleted = p, true
	}
	return m, true
}
