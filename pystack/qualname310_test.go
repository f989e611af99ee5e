package pystack

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/tracer"
)

// names310Script prints, for each case, the name 3.10 frames should get, the
// address of the code object and that of the class of self or cls (0: none),
// then the address of an instance's dict (a split table) and waits.
const names310Script = `
import collections, functools, sys

class Loader:
    class Shard:
        def pin(self): pass
        @classmethod
        def open(cls): pass
        @staticmethod
        def size(): pass
        @property
        def nbytes(self): pass

class Base:
    def release(self): pass

class Derived(Base):
    pass

def module_function(): pass

def outer():
    def inner(): pass
    return inner

def helper(self): pass

def deco(f):
    @functools.wraps(f)
    def wrapper(*args): return f(*args)
    return wrapper

class Outer:
    class Decorated:
        @deco
        def run(self): pass

class Point:
    def __init__(self):
        self.x, self.y = 1, 2

def case(name, code, cls=None):
    print(name, id(code), id(cls) if cls else 0)

shard = Loader.Shard
case("Loader.Shard.pin", shard.pin.__code__, shard)
case("Loader.Shard.open", shard.open.__code__, shard)
case("Loader.Shard.size", shard.size.__code__)
case("Loader.Shard.nbytes", shard.nbytes.fget.__code__, shard)
case("Base.release", Derived.release.__code__, Derived)
case("Loader.Shard.pin", shard.pin.__code__, int)  # self not a Shard: found through the module
case("module_function", module_function.__code__)
case("inner", outer().__code__)
case("OrderedDict.helper", helper.__code__, collections.OrderedDict)
case("Outer.Decorated.run", Outer.Decorated.run.__wrapped__.__code__, Outer.Decorated)
case("wrapper", Outer.Decorated.run.__code__)
print("split", id(Point().__dict__), flush=True)
sys.stdin.readline()
`

// TestNames310 names 3.10 code objects of a live interpreter as 3.11+ name
// them, which checks the layout of the objects read on the way.
func TestNames310(t *testing.T) {
	python := filepath.Join(pyenvVersions["3.10"], "bin/python3.10")
	script := filepath.Join(t.TempDir(), "names.py")
	if err := os.WriteFile(script, []byte(names310Script), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, script)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()

	type named struct {
		want  string
		frame tracer.PyFrame
	}
	var cases []named
	var split uint64
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if f[0] == "split" {
			split, _ = strconv.ParseUint(f[1], 10, 64)
			break
		}
		code, _ := strconv.ParseUint(f[1], 10, 64)
		class, _ := strconv.ParseUint(f[2], 10, 64)
		cases = append(cases, named{f[0], tracer.PyFrame{Code: code, Class: class}})
	}
	if split == 0 {
		t.Fatal("script did not finish")
	}

	p, err := Detect("/proc", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	r := NewResolver()
	if err := r.Add(p); err != nil {
		t.Fatal(err)
	}
	defer r.Forget(uint32(p.PID))
	for _, c := range cases {
		// Twice: the second from the caches.
		for range 2 {
			if got := r.Frames(uint32(p.PID), []tracer.PyFrame{c.frame})[0].Function; got != c.want {
				t.Errorf("code %#x, class %#x: %q, want %q", c.frame.Code, c.frame.Class, got, c.want)
			}
		}
	}

	proc := r.procs[uint32(p.PID)]
	keys, values := proc.dictItems(split)
	var names []string
	for _, k := range keys {
		name, _ := proc.unicode(k)
		names = append(names, name)
	}
	if !slices.Equal(names, []string{"x", "y"}) || len(values) != 2 {
		t.Errorf("split dict: keys %q, %d values", names, len(values))
	}
}
