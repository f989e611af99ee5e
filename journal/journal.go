// Package journal keeps, in a file on the host, the ring buffer's records
// an agent took, so that the next agent on the node starts from the books
// this one had: what only user space knows survives a restart (a SIGTERM of
// a rollout, a SIGKILL), while the pinned probes and ring buffer keep the
// kernel's side.
//
// A journal is one directory: a lock file held with flock(2) by the agent
// that owns it, and the file journal: a header saying whose state it is,
// then records, each [len u32][kind u32][pos u64][len bytes, padded to 8].
// Records are appended with write(2), so that the page cache keeps them
// once the call returns, whatever happens to the agent after.
package journal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Kind says what a record holds.
type Kind uint32

const (
	// KindRing is a ring buffer record as the BPF program wrote it; its
	// position is the ring's consumer position at its header.
	KindRing Kind = 1
	// KindCarried holds the counters of records compaction dropped
	// (package accounting's, encoded by the caller).
	KindCarried Kind = 2
)

// HeaderSize is the size of a journal file's header.
const HeaderSize = 128

const (
	magic      = "GPUMEMJ\x00"
	version    = 1
	recordHead = 16
	fileName   = "journal"
	lockName   = "lock"
)

// Owner is what makes a journal this agent's to continue: the BPF object
// that wrote its records, and the ring buffer they were read from (the
// boot, and the pinned map's ID within it). A journal of another owner is
// refused.
type Owner struct {
	Object [32]byte // SHA-256 of the BPF object
	Boot   string   // /proc/sys/kernel/random/boot_id
	Ring   uint32   // the ring buffer map's ID
}

// ErrLocked is returned by Open when another process owns the journal.
var ErrLocked = errors.New("another gpumem agent owns the state")

// Journal is an open journal, owned by this process until Close.
type Journal struct {
	dir     string
	lock    *os.File
	file    *os.File
	owner   Owner
	found   []byte       // the journal read at Open, until Continue
	covered uint64       // the ring position every record before was kept at
	size    atomic.Int64 // read by metrics while Append writes
	records []byte       // the records read at Open, until Replay
}

// Refusal says why Open started a journal afresh instead of continuing it.
type Refusal struct {
	Reason string // a short word for a metric's label: version, object, boot, ring, corrupt
	Detail string
}

func (r *Refusal) Error() string { return r.Detail }

// Open takes ownership of the journal in dir, creating dir if need be,
// and reads the journal it holds, if any, for Continue.
func Open(dir string) (*Journal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("make state directory: %w", err)
	}
	lock, err := takeLock(dir)
	if err != nil {
		return nil, err
	}
	j := &Journal{dir: dir, lock: lock}
	j.found, err = os.ReadFile(filepath.Join(dir, fileName))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		lock.Close()
		return nil, fmt.Errorf("read journal: %w", err)
	}
	return j, nil
}

// Continue continues the journal found at Open if owner's, its records
// kept for Replay. A journal of another owner, another format or a
// corrupt one is started afresh, and Continue says why (nil when
// continued or none was found).
func (j *Journal) Continue(owner Owner) (*Refusal, error) {
	j.owner = owner
	found := j.found
	j.found = nil
	if found == nil {
		return nil, j.start(0, nil)
	}
	refusal, err := j.read(found)
	if err != nil || refusal != nil {
		return refusal, errors.Join(err, j.start(0, nil))
	}
	return nil, nil
}

// Start starts the journal afresh for owner: its records are dropped.
func (j *Journal) Start(owner Owner) error {
	j.owner, j.records = owner, nil
	return j.start(0, nil)
}

// takeLock locks dir's lock file, writing this process's ID in it so that
// a refused agent can say which one holds it.
func takeLock(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open state lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := io.ReadAll(f)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w at %s (pid %s)", ErrLocked, dir, strings.TrimSpace(string(holder)))
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// read reads the journal found, leaving it open for appends when it is
// this owner's.
func (j *Journal) read(data []byte) (*Refusal, error) {
	path := filepath.Join(j.dir, fileName)
	covered, refusal := j.check(data)
	if refusal != nil {
		return refusal, nil
	}
	end, err := validEnd(data[HeaderSize:])
	if err != nil {
		return &Refusal{Reason: "corrupt", Detail: fmt.Sprintf("the journal at %s is corrupt: %v", path, err)}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open journal: %w", err)
	}
	// A record cut short by a crash in its write is dropped: its ring
	// position was not committed, so the ring still holds it.
	if err := f.Truncate(int64(HeaderSize + end)); err != nil {
		f.Close()
		return nil, fmt.Errorf("trim journal: %w", err)
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return nil, fmt.Errorf("open journal: %w", err)
	}
	j.file, j.covered = f, covered
	j.size.Store(int64(HeaderSize + end))
	j.records = data[HeaderSize : HeaderSize+end]
	return nil, nil
}

// check reads a journal's header: its covered position, or why it is not
// this owner's.
func (j *Journal) check(data []byte) (uint64, *Refusal) {
	if len(data) < HeaderSize || string(data[:8]) != magic {
		return 0, &Refusal{Reason: "corrupt", Detail: "the journal has no gpu-mem header"}
	}
	if v := binary.LittleEndian.Uint32(data[8:]); v != version {
		return 0, &Refusal{Reason: "version", Detail: fmt.Sprintf("the journal is of format %d, this gpumem reads format %d", v, version)}
	}
	var o Owner
	copy(o.Object[:], data[16:48])
	o.Boot = string(bytes.TrimRight(data[48:88], "\x00"))
	o.Ring = binary.LittleEndian.Uint32(data[88:])
	switch {
	case o.Boot != j.owner.Boot:
		return 0, &Refusal{Reason: "boot", Detail: "the journal is of an earlier boot, whose processes are gone"}
	case o.Object != j.owner.Object:
		return 0, &Refusal{Reason: "object", Detail: fmt.Sprintf("the journal was written by another gpu-mem, whose BPF program or its settings (--pid, --tensor-native-stacks) differ: %x, this one's %x", o.Object[:6], j.owner.Object[:6])}
	case o.Ring != j.owner.Ring:
		return 0, &Refusal{Reason: "ring", Detail: fmt.Sprintf("the journal was read from ring buffer %d, not the pinned one (%d)", o.Ring, j.owner.Ring)}
	}
	return binary.LittleEndian.Uint64(data[96:]), nil
}

// validEnd is where the whole records of recs end.
func validEnd(recs []byte) (int, error) {
	at := 0
	for at+recordHead <= len(recs) {
		n := int(binary.LittleEndian.Uint32(recs[at:]))
		kind := Kind(binary.LittleEndian.Uint32(recs[at+4:]))
		if kind != KindRing && kind != KindCarried {
			return 0, fmt.Errorf("a record of unknown kind %d at byte %d", kind, HeaderSize+at)
		}
		next := at + recordHead + padded(n)
		if next > len(recs) {
			break
		}
		at = next
	}
	return at, nil
}

func padded(n int) int { return (n + 7) &^ 7 }

func (j *Journal) header(covered uint64) []byte {
	h := make([]byte, HeaderSize)
	copy(h, magic)
	binary.LittleEndian.PutUint32(h[8:], version)
	copy(h[16:48], j.owner.Object[:])
	copy(h[48:88], j.owner.Boot)
	binary.LittleEndian.PutUint32(h[88:], j.owner.Ring)
	binary.LittleEndian.PutUint64(h[96:], covered)
	return h
}

// start writes a new journal holding records, covering the ring up to
// covered, and replaces the old one with it at once (rename(2)).
func (j *Journal) start(covered uint64, records []byte) error {
	path := filepath.Join(j.dir, fileName)
	tmp := path + ".new"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write journal: %w", err)
	}
	if _, err := f.Write(append(j.header(covered), records...)); err != nil {
		f.Close()
		return fmt.Errorf("write journal: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		f.Close()
		return fmt.Errorf("write journal: %w", err)
	}
	if j.file != nil {
		j.file.Close()
	}
	j.file, j.covered = f, covered
	j.size.Store(int64(HeaderSize + len(records)))
	return nil
}

// Covered is the ring position before which every record the journal
// needs was kept: ring records before it are not to be read again.
func (j *Journal) Covered() uint64 { return j.covered }

// Size is the journal file's size in bytes.
func (j *Journal) Size() int64 { return j.size.Load() }

// Replay calls fn with each record continued, in order, then forgets
// them.
func (j *Journal) Replay(fn func(kind Kind, pos uint64, payload []byte) error) error {
	recs := j.records
	j.records = nil
	return Each(recs, fn)
}

// Each calls fn with each record of recs, records as Append takes them.
func Each(recs []byte, fn func(kind Kind, pos uint64, payload []byte) error) error {
	for at := 0; at+recordHead <= len(recs); {
		n := int(binary.LittleEndian.Uint32(recs[at:]))
		kind := Kind(binary.LittleEndian.Uint32(recs[at+4:]))
		pos := binary.LittleEndian.Uint64(recs[at+8:])
		if err := fn(kind, pos, recs[at+recordHead:at+recordHead+n]); err != nil {
			return err
		}
		at += recordHead + padded(n)
	}
	return nil
}

// Records reads the journal's records, as Append wrote them.
func (j *Journal) Records() ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(j.dir, fileName))
	if err != nil {
		return nil, fmt.Errorf("read journal: %w", err)
	}
	if len(data) < HeaderSize {
		return nil, fmt.Errorf("read journal: %d bytes, shorter than its header", len(data))
	}
	return data[HeaderSize:], nil
}

// AppendRecord appends one record to buf, as Append takes them.
func AppendRecord(buf []byte, kind Kind, pos uint64, payload []byte) []byte {
	var h [recordHead]byte
	binary.LittleEndian.PutUint32(h[:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[4:], uint32(kind))
	binary.LittleEndian.PutUint64(h[8:], pos)
	buf = append(append(buf, h[:]...), payload...)
	var zeros [7]byte
	return append(buf, zeros[:padded(len(payload))-len(payload)]...)
}

// Append writes records (AppendRecord's) at the journal's end, in one
// write: once it returns, they outlive this process.
func (j *Journal) Append(records []byte) error {
	if len(records) == 0 {
		return nil
	}
	n, err := j.file.Write(records)
	j.size.Add(int64(n))
	if err != nil {
		return fmt.Errorf("append to journal: %w", err)
	}
	return nil
}

// Rewrite replaces the journal with records (compaction: those still
// needed), covering the ring up to covered.
func (j *Journal) Rewrite(covered uint64, records []byte) error {
	return j.start(covered, records)
}

// Close releases the journal, leaving it for the next owner.
func (j *Journal) Close() error {
	err := j.file.Close()
	j.lock.Close() // and the flock with it
	return err
}

// Clear removes the journal in dir, for an agent that is to start afresh
// (gpumem state clear); it fails while an agent owns it.
func Clear(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	lock, err := takeLock(dir)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := os.Remove(filepath.Join(dir, fileName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove journal: %w", err)
	}
	return nil
}
