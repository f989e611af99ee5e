package pystack

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// memory reads a process's memory: a live process's through /proc/PID/mem.
// The process is untrusted: it may put anything where its objects should
// be, loops included, so every read counts against a budget, set again for
// each stack named (setBudget), past which reads fail with errBudget.
type memory struct {
	r         io.ReaderAt
	closer    io.Closer
	left      int // reads left
	bytesLeft int // bytes left
	refused   bool
}

// errBudget is what a read returns once the budget is spent.
var errBudget = errors.New("read budget spent")

// budget is what a memory opened, and each stack named, may read: the
// reads and bytes of one check or one Resolver.Frames call. Naming a 3.10
// frame may read every module of sys.modules (about 50 reads each, 150k
// for a PyTorch process's 3000) and then the classes of one module; 3.11+
// frames take a few reads each. At about a microsecond a read, a hostile
// process costs at most a second or so per stack.
var budget = struct{ reads, bytes int }{1 << 20, 64 << 20}

// openMemory opens the memory of the process at procDir (/proc/PID).
func openMemory(procDir string) (*memory, error) {
	f, err := os.Open(filepath.Join(procDir, "mem"))
	if err != nil {
		return nil, fmt.Errorf("open memory: %w", err)
	}
	return newMemory(f, f), nil
}

// newMemory reads memory through r, an address being r's offset; closer,
// if not nil, is closed with it.
func newMemory(r io.ReaderAt, closer io.Closer) *memory {
	m := &memory{r: r, closer: closer}
	m.setBudget(budget.reads, budget.bytes)
	return m
}

func (m *memory) Close() error {
	if m.closer == nil {
		return nil
	}
	return m.closer.Close()
}

// setBudget allows reads more reads of bytes in all.
func (m *memory) setBudget(reads, bytes int) { m.left, m.bytesLeft, m.refused = reads, bytes, false }

// spent says whether a read was refused for the budget since it was set:
// what was computed from the reads is incomplete, not to be cached.
func (m *memory) spent() bool { return m.refused }

// readAt reads at addr, counted against the budget.
func (m *memory) readAt(buf []byte, addr uint64) (int, error) {
	if m.left <= 0 || m.bytesLeft < len(buf) {
		m.refused = true
		return 0, errBudget
	}
	m.left--
	m.bytesLeft -= len(buf)
	if addr > 1<<63-1 {
		return 0, fmt.Errorf("address %#x: out of range", addr)
	}
	return m.r.ReadAt(buf, int64(addr))
}

func (m *memory) read(addr uint64, buf []byte) error {
	if _, err := m.readAt(buf, addr); err != nil {
		if err == errBudget { // as it is: every read past the budget fails, and a walk may try thousands
			return err
		}
		return fmt.Errorf("read %d bytes at %#x: %w", len(buf), addr, err)
	}
	return nil
}

func (m *memory) pointer(addr uint64) (uint64, error) {
	var b [8]byte
	if err := m.read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func (m *memory) uint32(addr uint64) (uint32, error) {
	var b [4]byte
	if err := m.read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// cString reads a NUL-terminated string of at most max bytes.
func (m *memory) cString(addr uint64, max int) (string, error) {
	buf := make([]byte, max)
	n, err := m.readAt(buf, addr)
	if err == errBudget {
		return "", err
	}
	if n == 0 && err != nil {
		return "", fmt.Errorf("read string at %#x: %w", addr, err)
	}
	if i := bytes.IndexByte(buf[:n], 0); i >= 0 {
		return string(buf[:i]), nil
	}
	return "", fmt.Errorf("string at %#x longer than %d bytes", addr, max)
}
