package pystack

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/gpu-mem/gpu-mem/discover"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// ErrNotPython is returned by Detect for a process with no CPython runtime.
var ErrNotPython = errors.New("not a Python process")

// ErrNotReady is returned by Detect while the interpreter is starting.
var ErrNotReady = errors.New("Python interpreter not initialized yet")

// Process is a Python process the BPF program can walk.
type Process struct {
	PID     int
	Version string // minor version, "3.12"
	Runtime uint64 // address of _PyRuntime
	Layout  Layout
	procDir string // /proc/PID
}

// Walk is what the BPF program needs for this process.
func (p *Process) Walk() tracer.PythonWalk { return p.Layout.walk(p.Runtime) }

// Detect finds the CPython runtime of process pid: the mapped file that
// exports _PyRuntime, its version, and the runtime's address. It checks the
// layout against the live process before returning.
func Detect(procRoot string, pid int) (*Process, error) {
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	data, err := os.ReadFile(filepath.Join(dir, "maps"))
	if err != nil {
		return nil, fmt.Errorf("read maps of %d: %w", pid, err)
	}
	tried := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		m, ok := discover.ParseMapsLine(sc.Text())
		if !ok || m.Offset != 0 || tried[m.Path] {
			continue
		}
		version, ok := discover.PythonVersion(m.Path)
		if !ok {
			continue
		}
		tried[m.Path] = true
		p, err := detectIn(dir, m, version)
		if err != nil {
			return nil, fmt.Errorf("pid %d: %s: %w", pid, m.Path, err)
		}
		if p == nil {
			continue // the interpreter binary of a shared libpython
		}
		p.PID, p.procDir = pid, dir
		if err := p.check(); err != nil {
			return nil, fmt.Errorf("pid %d: %w", pid, err)
		}
		return p, nil
	}
	return nil, ErrNotPython
}

// detectIn reads the file mapped at m (its first page, offset 0). It returns
// nil when the file does not define _PyRuntime.
func detectIn(procDir string, m discover.Mapping, version string) (*Process, error) {
	path := filepath.Join(procDir, "map_files", fmt.Sprintf("%x-%x", m.Start, m.End))
	f, err := elf.Open(path)
	if err != nil {
		if f, err = elf.Open(filepath.Join(procDir, "root", m.Path)); err != nil {
			return nil, err
		}
	}
	defer f.Close()
	return detectFile(f, m.Start, version)
}

// detectFile is detectIn of the file opened, mapped at start.
func detectFile(f *elf.File, start uint64, version string) (*Process, error) {
	sym, ok := lookupSymbol(f, "_PyRuntime")
	if !ok {
		return nil, nil
	}
	layout, ok := layouts[version]
	if !ok {
		return nil, fmt.Errorf("Python %s is not supported (3.10 to 3.13 are)", version)
	}
	if version == "3.13" {
		var err error
		if layout, err = debugOffsets(f, sym, layout); err != nil {
			return nil, err
		}
		if err := layout.checkReadAtOnce(); err != nil {
			return nil, fmt.Errorf("_Py_DebugOffsets: %w", err)
		}
	}
	bias, err := loadBias(f, start)
	if err != nil {
		return nil, err
	}
	return &Process{Version: version, Runtime: bias + sym.Value, Layout: layout}, nil
}

func lookupSymbol(f *elf.File, name string) (elf.Symbol, bool) {
	for _, read := range []func() ([]elf.Symbol, error){f.DynamicSymbols, f.Symbols} {
		syms, _ := read()
		for _, s := range syms {
			if s.Name == name && s.Value != 0 {
				return s, true
			}
		}
	}
	return elf.Symbol{}, false
}

// loadBias is what was added to the file's addresses when it was mapped at
// start (its first page).
func loadBias(f *elf.File, start uint64) (uint64, error) {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			return start - (p.Vaddr &^ (p.Align - 1)), nil
		}
	}
	return 0, errors.New("no loadable segment")
}

// debugOffsets reads the layout 3.13 describes in _Py_DebugOffsets, the
// first member of _PyRuntime, from the file's initialized data.
func debugOffsets(f *elf.File, sym elf.Symbol, l Layout) (Layout, error) {
	const fields = 50
	raw := make([]byte, fields*8)
	if err := readVirtual(f, sym.Value, raw); err != nil {
		return l, fmt.Errorf("read _Py_DebugOffsets: %w", err)
	}
	if string(raw[:8]) != "xdebugpy" {
		return l, errors.New("_PyRuntime does not start with _Py_DebugOffsets")
	}
	at := func(i int) uint16 { return uint16(binary.LittleEndian.Uint64(raw[i*8:])) }
	if version := binary.LittleEndian.Uint64(raw[8:]); version>>16 != 0x030d {
		return l, fmt.Errorf("_Py_DebugOffsets of version %#x", version)
	}
	if binary.LittleEndian.Uint64(raw[16:]) != 0 {
		return l, errors.New("free-threaded builds are not supported")
	}
	// Indexes of the uint64 fields of _Py_DebugOffsets in 3.13.
	l.RuntimeInterpretersHead = at(5)
	l.InterpNext, l.InterpThreadsHead = at(8), at(9)
	l.TstateNext, l.TstateInterp, l.TstateFrame, l.TstateThreadID = at(21), at(22), at(23), at(24)
	l.TstateDatastackChunk = at(26)
	l.FramePrevious, l.FrameCode, l.FrameInstr, l.FrameOwner = at(29), at(30), at(31), at(33)
	l.CodeFilename, l.CodeName, l.CodeQualname, l.CodeLinetable, l.CodeFirstlineno = at(35), at(36), at(37), at(38), at(39)
	l.CodeAdaptive = at(43)
	l.TypeName = at(47)
	return l, nil
}

// readVirtual reads initialized data at a virtual address of the file.
func readVirtual(f *elf.File, addr uint64, buf []byte) error {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Vaddr <= addr && addr+uint64(len(buf)) <= p.Vaddr+p.Filesz {
			_, err := p.ReadAt(buf, int64(addr-p.Vaddr))
			return err
		}
	}
	return fmt.Errorf("address %#x is not in the file's data", addr)
}

// check follows _PyRuntime to the first thread state in the live process
// and back to its interpreter: a wrong layout breaks the round trip.
func (p *Process) check() error {
	mem, err := openMemory(p.procDir)
	if err != nil {
		return err
	}
	defer mem.Close()
	interp, err := mem.pointer(p.Runtime + uint64(p.Layout.RuntimeInterpretersHead))
	if err != nil {
		return err
	}
	if interp == 0 {
		return ErrNotReady
	}
	ts, err := mem.pointer(interp + uint64(p.Layout.InterpThreadsHead))
	if err != nil {
		return err
	}
	if ts == 0 {
		return ErrNotReady
	}
	back, err := mem.pointer(ts + uint64(p.Layout.TstateInterp))
	if err != nil {
		return err
	}
	if back != interp {
		return fmt.Errorf("Python %s layout does not match this interpreter (thread state %#x points to interpreter %#x, not %#x)", p.Version, ts, back, interp)
	}
	return nil
}
