package pystack

import (
	"encoding/binary"
	"strings"
)

// Python 3.10's code objects have co_name only: co_qualname came with 3.11.
// The qualified name is on the function object (func_qualname), which a 3.10
// frame does not point to, so name310 looks for the function where Python
// keeps it: in the dicts of the class of self or cls and of its bases (an
// inherited method is named by the class that defines it, as in 3.11), else
// among the classes of the code's module and the classes nested in them
// (staticmethods). A function nested in a function is in no dict: it keeps
// co_name, as does any code not found, after the qualified name of the class
// of self or cls where there is one.

// Layout of 3.10 objects whose structs are private to CPython's .c files,
// not in its headers: TestNames310 checks them on a live interpreter.
const (
	obType        = 8  // PyObject.ob_type
	tupleSize     = 16 // PyVarObject.ob_size
	wrappedFunc   = 16 // classmethod.cm_callable, staticmethod.sm_callable
	propertyFuncs = 16 // property: fget, fset, fdel, one after the other
	keysSize      = 8  // PyDictKeysObject.dk_size
	keysNentries  = 32 // dk_nentries
	keysIndices   = 40 // dk_indices: dk_size indexes, then the entries
	keyEntrySize  = 24 // PyDictKeyEntry: me_hash, me_key, me_value

	tpflagsHeapType     = 1 << 9
	tpflagsTypeSubclass = 1 << 31
)

// Bounds on what naming one frame reads.
const (
	maxMRO     = 64      // classes in an MRO
	maxEntries = 1 << 14 // entries of a dict
	maxNesting = 8       // classes in classes
	maxClasses = 4096    // classes indexed for one module
)

// kind is what an object is, as far as naming functions goes.
type kind uint8

const (
	otherKind kind = iota
	classKind
	moduleKind
	functionKind
	wrapperKind // classmethod, staticmethod
	propertyKind
)

// names310 is what a 3.10 process's names are found with, cached.
type names310 struct {
	names   map[[2]uint64]string // (code object, class of self or cls) -> name
	kinds   map[uint64]kind      // type -> kind of its instances
	files   dictCache[string, uint64]
	modules map[uint64]*dictCache[uint64, uint64] // module dict -> code -> function
}

// dictCache is what was computed from a dict, with the dict's version then
// (3.10 gives every change of every dict a new version).
type dictCache[K comparable, V any] struct {
	version uint64
	m       map[K]V
}

// lookup finds key in what was computed from dict, computing it again first
// if key is missing and dict has changed since.
func lookup[K comparable, V any](p *process, c *dictCache[K, V], dict uint64, key K, compute func(dict uint64) map[K]V) (V, bool) {
	if v, ok := c.m[key]; ok {
		return v, true
	}
	version, err := p.mem.pointer(dict + uint64(p.Layout.Names310.DictVersion))
	if err != nil || c.m != nil && version == c.version {
		return v0[V](), false
	}
	m := compute(dict)
	if !p.mem.spent() { // a map cut short by the budget is used once, not kept
		c.version, c.m = version, m
		for k := range m {
			p.cacheBytes += cacheEntryBytes
			if s, ok := any(k).(string); ok {
				p.cacheBytes += len(s)
			}
		}
	}
	v, ok := m[key]
	return v, ok
}

func v0[V any]() (v V) { return v }

// name310 names a 3.10 frame of code c (at code) as 3.11+ name it; class is
// the class of the frame's first argument, 0 if none.
func (p *process) name310(code uint64, c *code, class uint64) string {
	if p.n310 == nil {
		p.n310 = &names310{names: map[[2]uint64]string{}, kinds: map[uint64]kind{}, modules: map[uint64]*dictCache[uint64, uint64]{}}
	}
	if c.firstArg != "self" && c.firstArg != "cls" {
		class = 0
	}
	key := [2]uint64{code, class}
	if name, ok := p.n310.names[key]; ok {
		return name
	}
	name := ""
	if class != 0 {
		name = p.inMRO(class, code, c.qualname)
	}
	if name == "" {
		name = p.inModule(code, c)
	}
	if name == "" {
		name = c.qualname
		if class != 0 {
			if cn := p.className(class); cn != "" {
				name = cn + "." + name
			}
		}
	}
	if !p.mem.spent() {
		p.n310.names[key] = name
		p.cacheBytes += len(name) + cacheEntryBytes
	}
	return name
}

// inMRO looks for the function of code in the dicts of class and its bases.
func (p *process) inMRO(class, code uint64, coName string) string {
	mro, err := p.mem.pointer(class + uint64(p.Layout.Names310.TypeMro))
	if err != nil {
		return ""
	}
	for _, base := range p.tupleItems(mro, maxMRO) {
		funcs, _ := p.members(base)
		for _, fn := range funcs {
			if p.funcCode(fn) == code {
				if name := p.funcName(fn, coName); name != "" {
					return name
				}
			}
		}
	}
	return ""
}

// inModule looks for the function of code among the classes of the module
// whose __file__ is the code's file, and the classes nested in them.
func (p *process) inModule(code uint64, c *code) string {
	if strings.HasPrefix(c.filename, "<") { // <frozen ...>, <string>: no module file
		return ""
	}
	interp, err := p.mem.pointer(p.Runtime + uint64(p.Layout.RuntimeInterpretersHead))
	if err != nil || interp == 0 {
		return ""
	}
	modules, err := p.mem.pointer(interp + uint64(p.Layout.Names310.InterpModules))
	if err != nil || modules == 0 {
		return ""
	}
	dict, ok := lookup(p, &p.n310.files, modules, c.filename, p.moduleFiles)
	if !ok {
		return ""
	}
	index := p.n310.modules[dict]
	if index == nil {
		index = &dictCache[uint64, uint64]{}
		p.n310.modules[dict] = index
		p.cacheBytes += cacheEntryBytes
	}
	fn, ok := lookup(p, index, dict, code, p.classFunctions)
	if !ok {
		return ""
	}
	return p.funcName(fn, c.qualname)
}

// moduleFiles maps the __file__ of each module of sys.modules to the
// module's dict.
func (p *process) moduleFiles(modules uint64) map[string]uint64 {
	files := map[string]uint64{}
	_, values := p.dictItems(modules)
	for _, module := range values {
		if p.mem.spent() { // every read fails from here
			break
		}
		if p.kindOf(module) != moduleKind {
			continue
		}
		dict, err := p.mem.pointer(module + uint64(p.Layout.Names310.ModuleDict))
		if err != nil {
			continue
		}
		keys, values := p.dictItems(dict)
		for i, key := range keys {
			if name, _ := p.unicode(key); name == "__file__" {
				if file, err := p.unicode(values[i]); err == nil {
					files[file] = dict
				}
				break
			}
		}
	}
	return files
}

// classFunctions maps the code of each function of the classes of a
// module's dict, and of the classes nested in them, to its function.
func (p *process) classFunctions(dict uint64) map[uint64]uint64 {
	functions := map[uint64]uint64{}
	seen := map[uint64]bool{}
	var walk func(classes []uint64, depth int)
	walk = func(classes []uint64, depth int) {
		for _, class := range classes {
			if depth > maxNesting || seen[class] || len(seen) >= maxClasses {
				continue
			}
			seen[class] = true
			funcs, nested := p.members(class)
			for _, fn := range funcs {
				if code := p.funcCode(fn); code != 0 && functions[code] == 0 {
					functions[code] = fn
				}
			}
			walk(nested, depth+1)
		}
	}
	var top []uint64
	_, values := p.dictItems(dict)
	for _, v := range values {
		if p.kindOf(v) == classKind {
			top = append(top, v)
		}
	}
	walk(top, 0)
	return functions
}

// members are the functions in the dict of a class defined in Python (plain
// functions, those of classmethods and staticmethods, property accessors)
// and the classes in it.
func (p *process) members(class uint64) (funcs, classes []uint64) {
	if flags, err := p.mem.pointer(class + uint64(p.Layout.TypeFlags)); err != nil || flags&tpflagsHeapType == 0 {
		return nil, nil
	}
	dict, err := p.mem.pointer(class + uint64(p.Layout.Names310.TypeDict))
	if err != nil {
		return nil, nil
	}
	function := func(addr uint64) {
		if fn, err := p.mem.pointer(addr); err == nil && p.kindOf(fn) == functionKind {
			funcs = append(funcs, fn)
		}
	}
	_, values := p.dictItems(dict)
	for _, v := range values {
		switch p.kindOf(v) {
		case functionKind:
			funcs = append(funcs, v)
		case wrapperKind:
			function(v + wrappedFunc)
		case propertyKind:
			for i := uint64(0); i < 3; i++ {
				function(v + propertyFuncs + 8*i)
			}
		case classKind:
			classes = append(classes, v)
		}
	}
	return funcs, classes
}

func (p *process) funcCode(fn uint64) uint64 {
	code, _ := p.mem.pointer(fn + uint64(p.Layout.Names310.FuncCode))
	return code
}

// funcName is the qualified name of function fn, whose code is named
// coName; "" if its name is not that of its code (a functools.wraps wrapper
// carries the name of the function it wraps).
func (p *process) funcName(fn uint64, coName string) string {
	name, err := p.stringAt(fn + uint64(p.Layout.Names310.FuncQualname))
	if err != nil || name != coName && !strings.HasSuffix(name, "."+coName) {
		return ""
	}
	return name
}

// kindOf tells classes, modules and the objects that hold functions.
func (p *process) kindOf(obj uint64) kind {
	if obj == 0 {
		return otherKind
	}
	typ, err := p.mem.pointer(obj + obType)
	if err != nil {
		return otherKind
	}
	if k, ok := p.n310.kinds[typ]; ok {
		return k
	}
	k := otherKind
	if flags, err := p.mem.pointer(typ + uint64(p.Layout.TypeFlags)); err == nil {
		switch {
		case flags&tpflagsTypeSubclass != 0:
			k = classKind
		case flags&tpflagsHeapType == 0: // built in: known by its name
			switch name, _ := p.typeName(typ); name {
			case "module":
				k = moduleKind
			case "function":
				k = functionKind
			case "classmethod", "staticmethod":
				k = wrapperKind
			case "property":
				k = propertyKind
			}
		}
	}
	if !p.mem.spent() {
		p.n310.kinds[typ] = k
		p.cacheBytes += cacheEntryBytes
	}
	return k
}

// className is the qualified name of a class: __qualname__ for a class
// defined in Python, the name after the module for a built-in one.
func (p *process) className(class uint64) string {
	if name, ok := p.classes[class]; ok {
		return name
	}
	var name string
	if flags, err := p.mem.pointer(class + uint64(p.Layout.TypeFlags)); err == nil && flags&tpflagsHeapType != 0 {
		name, _ = p.stringAt(class + uint64(p.Layout.Names310.HeapTypeQualname))
	}
	if name == "" {
		name, _ = p.typeName(class)
		name = name[strings.LastIndexByte(name, '.')+1:]
	}
	if !p.mem.spent() {
		p.classes[class] = name
		p.cacheBytes += len(name) + cacheEntryBytes
	}
	return name
}

// typeName is a type's tp_name.
func (p *process) typeName(typ uint64) (string, error) {
	ptr, err := p.mem.pointer(typ + uint64(p.Layout.TypeName))
	if err != nil {
		return "", err
	}
	return p.mem.cString(ptr, 256)
}

// tupleItems reads the items of a tuple, at most max.
func (p *process) tupleItems(tuple uint64, max int) []uint64 {
	size, err := p.mem.pointer(tuple + tupleSize)
	if err != nil || size == 0 {
		return nil
	}
	raw := make([]byte, 8*min(size, uint64(max)))
	if p.mem.read(tuple+uint64(p.Layout.TupleItems), raw) != nil {
		return nil
	}
	return words(raw)
}

// dictItems reads the keys and values of a 3.10 dict, in insertion order,
// at most maxEntries.
func (p *process) dictItems(dict uint64) (keys, values []uint64) {
	n := p.Layout.Names310
	var head [16]byte // ma_keys, ma_values
	if dict == 0 || p.mem.read(dict+uint64(n.DictKeys), head[:]) != nil {
		return nil, nil
	}
	dk, split := binary.LittleEndian.Uint64(head[:]), binary.LittleEndian.Uint64(head[8:])
	var kh [keysIndices]byte
	if p.mem.read(dk, kh[:]) != nil {
		return nil, nil
	}
	size, count := binary.LittleEndian.Uint64(kh[keysSize:]), binary.LittleEndian.Uint64(kh[keysNentries:])
	if size == 0 || count > size {
		return nil, nil
	}
	count = min(count, maxEntries)
	index := uint64(8) // bytes per index (DK_IXSIZE)
	switch {
	case size <= 0xff:
		index = 1
	case size <= 0xffff:
		index = 2
	case size <= 0xffffffff:
		index = 4
	}
	entries := make([]byte, count*keyEntrySize)
	if p.mem.read(dk+keysIndices+size*index, entries) != nil {
		return nil, nil
	}
	var splitValues []uint64 // a split table keeps its values apart
	if split != 0 {
		raw := make([]byte, 8*count)
		if p.mem.read(split, raw) != nil {
			return nil, nil
		}
		splitValues = words(raw)
	}
	for i := uint64(0); i < count; i++ {
		e := entries[i*keyEntrySize:]
		key, value := binary.LittleEndian.Uint64(e[8:]), binary.LittleEndian.Uint64(e[16:])
		if splitValues != nil {
			value = splitValues[i]
		}
		if key != 0 && value != 0 {
			keys, values = append(keys, key), append(values, value)
		}
	}
	return keys, values
}

func words(raw []byte) []uint64 {
	w := make([]uint64, len(raw)/8)
	for i := range w {
		w[i] = binary.LittleEndian.Uint64(raw[8*i:])
	}
	return w
}
