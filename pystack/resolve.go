package pystack

import (
	"errors"
	"fmt"
	"sync"

	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// Frame is a named Python frame; Entry as in tracer.PyFrame.
type Frame struct {
	symbolize.Frame
	Entry bool
}

// Resolver names the Python frames of registered processes, reading their
// code objects through /proc/PID/mem once per code object.
type Resolver struct {
	mu    sync.Mutex
	procs map[uint32]*process
}

type process struct {
	*Process
	mem     *memory
	codes   map[uint64]*code
	classes map[uint64]string // 3.10: class -> qualified name
	n310    *names310         // 3.10: what names are found with
	// cacheBytes is about what codes, classes and n310 hold; bound drops
	// them past maxCacheBytes.
	cacheBytes int
}

type code struct {
	qualname  string // co_qualname; co_name before 3.11
	filename  string
	firstLine int
	linetable []byte
	firstArg  string // 3.10: co_varnames[0], to tell methods (self, cls)
	err       error
}

// NewResolver returns an empty Resolver.
func NewResolver() *Resolver { return &Resolver{procs: map[uint32]*process{}} }

// Add starts naming the frames of p.
func (r *Resolver) Add(p *Process) error {
	mem, err := openMemory(p.procDir)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.procs[uint32(p.PID)]; old != nil {
		old.mem.Close()
	}
	r.procs[uint32(p.PID)] = &process{Process: p, mem: mem, codes: map[uint64]*code{}, classes: map[uint64]string{}}
	return nil
}

// Has says whether pid is a registered Python process.
func (r *Resolver) Has(pid uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.procs[pid] != nil
}

// Forget drops an exited process.
func (r *Resolver) Forget(pid uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.procs[pid]; p != nil {
		p.mem.Close()
		delete(r.procs, pid)
	}
}

// Frames names captured frames, innermost first. A frame whose code object
// cannot be read is named as such. The process's memory is read within
// budget per call: a process that fills its objects with loops or garbage
// costs a bounded time and memory per stack, its frames then named as
// unreadable or by their code's name.
func (r *Resolver) Frames(pid uint32, frames []tracer.PyFrame) []Frame {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.procs[pid]
	if p != nil {
		p.mem.setBudget(budget.reads, budget.bytes)
		p.bound()
	}
	out := make([]Frame, len(frames))
	for i, f := range frames {
		out[i].Entry = f.Entry
		if p == nil {
			out[i].Function = fmt.Sprintf("[Python code %#x of an unregistered process]", f.Code)
			continue
		}
		out[i].Frame = p.frame(f)
	}
	return out
}

func (p *process) frame(f tracer.PyFrame) symbolize.Frame {
	c := p.code(f.Code)
	if c.err != nil {
		return symbolize.Frame{Function: fmt.Sprintf("[unreadable Python code %#x]", f.Code)}
	}
	name := c.qualname
	if p.Layout.CodeQualname == tracer.PyNoField {
		name = p.name310(f.Code, c, f.Class)
	}
	return symbolize.Frame{Function: name, File: c.filename, Line: int64(p.line(c, f))}
}

func (p *process) line(c *code, f tracer.PyFrame) int {
	if p.Layout.InstrSize == 4 {
		return line310(c.linetable, c.firstLine, int(int32(f.Instr))*2)
	}
	start := f.Code + uint64(p.Layout.CodeAdaptive)
	if f.Instr < start {
		return 0
	}
	return line311(c.linetable, c.firstLine, int(f.Instr-start)/2)
}

func (p *process) code(addr uint64) *code {
	if c, ok := p.codes[addr]; ok {
		return c
	}
	c := p.readCode(addr)
	if !errors.Is(c.err, errBudget) { // read again next time
		p.codes[addr] = c
		p.cacheBytes += len(c.qualname) + len(c.filename) + len(c.linetable) + len(c.firstArg) + cacheEntryBytes
	}
	return c
}

// Bounds on what is cached per process: a process can make up any number
// of code objects and classes, and strings of up to 256 KiB each.
const (
	maxCacheBytes   = 64 << 20
	cacheEntryBytes = 128 // an entry's own cost, beyond its strings
)

// bound drops what is cached of the process's objects past maxCacheBytes;
// it is read again as frames need it.
func (p *process) bound() {
	if p.cacheBytes <= maxCacheBytes {
		return
	}
	p.codes, p.classes, p.n310, p.cacheBytes = map[uint64]*code{}, map[uint64]string{}, nil, 0
}

func (p *process) readCode(addr uint64) *code {
	l := p.Layout
	c := &code{}
	nameField := l.CodeQualname
	if nameField == tracer.PyNoField {
		nameField = l.CodeName
	}
	var err error
	if c.qualname, err = p.stringAt(addr + uint64(nameField)); err != nil {
		return &code{err: err}
	}
	if c.filename, err = p.stringAt(addr + uint64(l.CodeFilename)); err != nil {
		return &code{err: err}
	}
	first, err := p.mem.uint32(addr + uint64(l.CodeFirstlineno))
	if err != nil {
		return &code{err: err}
	}
	c.firstLine = int(int32(first))
	if c.linetable, err = p.bytesAt(addr + uint64(l.CodeLinetable)); err != nil {
		return &code{err: err}
	}
	if l.CodeVarnames != tracer.PyNoField {
		c.firstArg = p.firstName(addr + uint64(l.CodeVarnames))
	}
	return c
}

// firstName is the first string of the tuple pointed to at field, or "".
func (p *process) firstName(field uint64) string {
	tuple, err := p.mem.pointer(field)
	if err != nil || tuple == 0 {
		return ""
	}
	size, err := p.mem.pointer(tuple + 16) // ob_size
	if err != nil || size == 0 {
		return ""
	}
	name, _ := p.stringAt(tuple + uint64(p.Layout.TupleItems))
	return name
}

// stringAt reads the str object pointed to at field.
func (p *process) stringAt(field uint64) (string, error) {
	obj, err := p.mem.pointer(field)
	if err != nil {
		return "", err
	}
	return p.unicode(obj)
}

// unicode reads a compact str object (all names and file names are).
func (p *process) unicode(obj uint64) (string, error) {
	length, err := p.mem.pointer(obj + 16)
	if err != nil {
		return "", err
	}
	state, err := p.mem.uint32(obj + 32)
	if err != nil {
		return "", err
	}
	kind, compact, ascii := int(state>>2)&7, state>>5&1 == 1, state>>6&1 == 1
	if !compact || length > 1<<16 || kind == 0 || kind == 3 || kind > 4 {
		return "", fmt.Errorf("str at %#x: not a compact string", obj)
	}
	data := obj + uint64(p.Layout.UnicodeCompact)
	if ascii {
		data = obj + uint64(p.Layout.UnicodeASCII)
	}
	raw := make([]byte, int(length)*kind)
	if err := p.mem.read(data, raw); err != nil {
		return "", err
	}
	if kind == 1 && ascii {
		return string(raw), nil
	}
	runes := make([]rune, length)
	for i := range runes {
		switch kind {
		case 1:
			runes[i] = rune(raw[i])
		case 2:
			runes[i] = rune(uint16(raw[2*i]) | uint16(raw[2*i+1])<<8)
		case 4:
			runes[i] = rune(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
	}
	return string(runes), nil
}

// bytesAt reads the bytes object pointed to at field.
func (p *process) bytesAt(field uint64) ([]byte, error) {
	obj, err := p.mem.pointer(field)
	if err != nil {
		return nil, err
	}
	size, err := p.mem.pointer(obj + 16)
	if err != nil {
		return nil, err
	}
	if size > 1<<20 {
		return nil, fmt.Errorf("bytes at %#x: %d bytes", obj, size)
	}
	buf := make([]byte, size)
	return buf, p.mem.read(obj+uint64(p.Layout.BytesData), buf)
}
