package pystack

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
)

// memory reads a live process's memory through /proc/PID/mem.
type memory struct {
	f *os.File
}

// openMemory opens the memory of the process at procDir (/proc/PID).
func openMemory(procDir string) (*memory, error) {
	f, err := os.Open(filepath.Join(procDir, "mem"))
	if err != nil {
		return nil, fmt.Errorf("open memory: %w", err)
	}
	return &memory{f: f}, nil
}

func (m *memory) Close() error { return m.f.Close() }

func (m *memory) read(addr uint64, buf []byte) error {
	if _, err := m.f.ReadAt(buf, int64(addr)); err != nil {
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
	n, err := m.f.ReadAt(buf, int64(addr))
	if n == 0 && err != nil {
		return "", fmt.Errorf("read string at %#x: %w", addr, err)
	}
	if i := bytes.IndexByte(buf[:n], 0); i >= 0 {
		return string(buf[:i]), nil
	}
	return "", fmt.Errorf("string at %#x longer than %d bytes", addr, max)
}
