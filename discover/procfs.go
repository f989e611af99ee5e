package discover

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// The files of /proc are read here with plain system calls into buffers
// the caller keeps: a scan lists /proc and reads stat files thousands of
// times a minute, where os.ReadFile would add an fstat, a poller
// registration and an allocation to each (measured: 15 us a stat file
// through it, 9 us here; a listing of 1,000 processes 490 us with
// Readdirnames, 350 us here).

// listBuffer is the size of a buffer for listPIDs: a few system calls for
// thousands of processes (a record is about 24 bytes).
const listBuffer = 64 << 10

// listPIDs appends the processes under procRoot to pids, unsorted: the
// names alone, read into buf, without a stat of each entry.
func listPIDs(procRoot string, buf []byte, pids []int) ([]int, error) {
	fd, err := unix.Open(procRoot, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", &fs.PathError{Op: "open", Path: procRoot, Err: err})
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, fmt.Errorf("list processes: %w", os.NewSyscallError("getdents64", err))
		}
		if n <= 0 {
			return pids, nil
		}
		pids = appendPIDs(pids, buf[:n])
	}
}

// appendPIDs appends the numeric names among the linux_dirent64 records in
// buf (inode, offset, 16-bit record length, type, NUL-terminated name).
func appendPIDs(pids []int, buf []byte) []int {
	const nameAt = 19
	for len(buf) > nameAt {
		size := int(binary.NativeEndian.Uint16(buf[16:18]))
		if size <= nameAt || size > len(buf) {
			break
		}
		name := buf[nameAt:size]
		if end := bytes.IndexByte(name, 0); end >= 0 {
			name = name[:end]
		}
		if pid, ok := decimal(name); ok && pid > 0 && pid <= 1<<22 { // PID_MAX_LIMIT
			pids = append(pids, int(pid))
		}
		buf = buf[size:]
	}
	return pids
}

// decimal is the value of a string of decimal digits, and false for
// anything else (a sign, a space, nothing, more than 64 bits).
func decimal(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		next := v*10 + uint64(c-'0')
		if next/10 != v {
			return 0, false
		}
		v = next
	}
	return v, true
}

// openLoadavg opens procRoot's loadavg, whose last field is the PID the
// kernel handed out last in the PID namespace of its reader, not of the
// mount: so only when that namespace is this process's own (procRoot's
// self is this process). -1 when it is not, or cannot be opened.
func openLoadavg(procRoot string) int {
	if self, err := os.Readlink(procRoot + "/self"); err != nil || self != strconv.Itoa(os.Getpid()) {
		return -1
	}
	fd, err := unix.Open(procRoot+"/loadavg", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
}

// lastPID reads the last PID from a loadavg opened by openLoadavg; -1 when
// unknown.
func lastPID(loadavg int, buf []byte) int {
	data := readAt0(loadavg, buf)
	fields := bytes.Fields(data)
	if len(fields) != 5 {
		return -1
	}
	last, err := strconv.Atoi(string(fields[4]))
	if err != nil {
		return -1
	}
	return last
}

// readFileOf reads process pid's file name (a small one: stat) into buf in
// one read, as the kernel writes it at the first read when it fits.
func readFileOf(procRoot string, pid int, name string, buf []byte) ([]byte, error) {
	fd, data, err := openFileOf(procRoot, pid, name, buf)
	if err != nil {
		return nil, err
	}
	unix.Close(fd)
	return data, nil
}

// openFileOf is readFileOf that leaves the file open, for the caller to
// read again with readAt0 and to close.
func openFileOf(procRoot string, pid int, name string, buf []byte) (int, []byte, error) {
	path := procRoot + "/" + strconv.Itoa(pid) + "/" + name
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	n, err := unix.Read(fd, buf)
	if err == nil && n == len(buf) {
		err = fmt.Errorf("longer than %d bytes", len(buf))
	}
	if err != nil {
		unix.Close(fd)
		return -1, nil, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	return fd, buf[:n], nil
}

// readAt0 reads an open file again from its start, in one read; nil when
// that fails (a procfs file whose process has exited: ESRCH) or does not
// fit in buf.
func readAt0(fd int, buf []byte) []byte {
	n, err := unix.Pread(fd, buf, 0)
	if err != nil || n == len(buf) {
		return nil
	}
	return buf[:n]
}
