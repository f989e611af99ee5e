//go:build fuzzseed

// The seed corpora of pystack's fuzz targets (testdata/fuzz), written by
// go generate -tags fuzzseed (make fuzz-seeds), not by go test.

package pystack

//go:generate go test -tags fuzzseed -run ^TestWriteSeeds$ -count=1 .

import (
	"bufio"
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/internal/fuzzseed"
	"github.com/gpu-mem/gpu-mem/tracer"
)

func TestWriteSeeds(t *testing.T) {
	t.Run("FuzzDetect", writeDetectSeeds)
	t.Run("FuzzFrames", writeFramesSeeds)
}

// runtimeLibrary is a libpython that exports _PyRuntime; with debugOffsets,
// that is 3.13's _Py_DebugOffsets (cookie, version, free-threading, then
// the offsets debugOffsets reads, at their indexes), as far as it reads.
func runtimeLibrary(debugOffsets bool) string {
	if !debugOffsets {
		return "char _PyRuntime[64] = {1};\n"
	}
	l := layouts["3.13"]
	words := make([]uint64, 50)
	copy(words, []uint64{0x7970677562656478, 0x030d00f0, 0}) // "xdebugpy"
	for i, v := range map[int]uint16{5: l.RuntimeInterpretersHead, 8: l.InterpNext, 9: l.InterpThreadsHead, 21: l.TstateNext,
		22: l.TstateInterp, 23: l.TstateFrame, 24: l.TstateThreadID, 26: l.TstateDatastackChunk, 29: l.FramePrevious,
		30: l.FrameCode, 31: l.FrameInstr, 33: l.FrameOwner, 35: l.CodeFilename, 36: l.CodeName, 37: l.CodeQualname,
		38: l.CodeLinetable, 39: l.CodeFirstlineno, 43: l.CodeAdaptive, 47: l.TypeName} {
		words[i] = uint64(v)
	}
	var init []string
	for _, w := range words {
		init = append(init, fmt.Sprintf("%#xULL", w))
	}
	return "unsigned long long _PyRuntime[" + strconv.Itoa(len(words)) + "] = {" + strings.Join(init, ", ") + "};\n"
}

// writeDetectSeeds builds libpython 3.12 and 3.13 (with _Py_DebugOffsets)
// and writes each, and each cut in half. They are linked without the C
// library and with segments aligned to 64 bytes, not pages: 1392 and 1728
// bytes, where a default link took 17968, 95% of them zeros (page padding,
// a 4 KB _PyRuntime) that the fuzzer mutated for nothing.
func writeDetectSeeds(t *testing.T) {
	var seeds []fuzzseed.Seed
	for _, c := range []struct {
		version string
		debug   bool
	}{{"3.12", false}, {"3.13", true}} {
		dir := t.TempDir()
		src, lib := filepath.Join(dir, "runtime.c"), filepath.Join(dir, "libpython"+c.version+".so.1.0")
		if err := os.WriteFile(src, []byte(runtimeLibrary(c.debug)), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cc", "-shared", "-fPIC", "-s", "-nostdlib", "-Wl,--build-id=none", "-Wl,-z,noseparate-code",
			"-Wl,-z,max-page-size=0x40", "-o", lib, src).CombinedOutput(); err != nil {
			t.Fatalf("cc: %v\n%s", err, out)
		}
		data, err := os.ReadFile(lib)
		if err != nil {
			t.Fatal(err)
		}
		ef, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		if p, err := detectFile(ef, 0x7f0000000000, c.version); err != nil || p == nil || p.Layout != layouts[c.version] {
			t.Fatalf("%s: %+v, %v", lib, p, err)
		}
		seeds = append(seeds, fuzzseed.Of("libpython"+c.version, data, c.version, uint64(0x7f0000000000)),
			fuzzseed.Of("libpython"+c.version+"-cut", data[:len(data)/2], c.version, uint64(0x7f0000000000)))
	}
	fuzzseed.Write(t, "FuzzDetect", seeds)
}

// recorder records what is read through it: the memory a resolver needs to
// name frames again without the process.
type recorder struct {
	r    io.ReaderAt
	segs []segment
}

func (rec *recorder) ReadAt(buf []byte, off int64) (int, error) {
	n, err := rec.r.ReadAt(buf, off)
	if n > 0 {
		rec.segs = append(rec.segs, segment{uint64(off), bytes.Clone(buf[:n])})
	}
	return n, err
}

// merged are the recorded segments, overlapping and adjacent ones joined.
func (rec *recorder) merged() []segment {
	segs := slices.Clone(rec.segs)
	slices.SortFunc(segs, func(a, b segment) int { return cmp.Compare(a.addr, b.addr) })
	var out []segment
	for _, s := range segs {
		if len(out) > 0 {
			last := &out[len(out)-1]
			if end := last.addr + uint64(len(last.data)); s.addr <= end {
				if tail := s.addr + uint64(len(s.data)); tail > end {
					last.data = append(last.data, s.data[end-s.addr:]...)
				}
				continue
			}
		}
		out = append(out, segment{s.addr, bytes.Clone(s.data)})
	}
	return out
}

// framesScript prints, for each case, a code object's address and the
// class of self or cls (3.10 names methods from it), then waits: methods,
// class and static methods, properties, nested classes and functions,
// lambdas, comprehensions, a decorated function and names beyond ASCII.
const framesScript = `
import functools, sys

class Loader:
    class Shard:
        def pin(self): pass
        @classmethod
        def open(cls): pass
        @staticmethod
        def size(): pass
        @property
        def nbytes(self): pass

def outer():
    def inner(): pass
    return inner

def deco(f):
    @functools.wraps(f)
    def wrapper(*args): return f(*args)
    return wrapper

@deco
def decorated(): pass

def größe(): pass
def 加载(): pass
square = lambda x: x * x
listcomp = compile("[x for x in range(3)]", "<listcomp>", "eval")

def case(code, cls=None):
    print(id(code), id(cls) if cls else 0)

shard = Loader.Shard
case(shard.pin.__code__, shard)
case(shard.open.__code__, shard)
case(shard.size.__code__)
case(shard.nbytes.fget.__code__, shard)
case(outer().__code__)
case(decorated.__code__)
case(größe.__code__)
case(加载.__code__)
case(square.__code__)
case(listcomp)
print("end", flush=True)
sys.stdin.readline()
`

// writeFramesSeeds writes modulesLoop, and with GPUMEM_RECORD_SEEDS=1 runs
// each interpreter, names its frames through a recorder and writes what was
// read: real code objects, strings, line tables, and for 3.10 sys.modules,
// modules, classes and their dicts.
func writeFramesSeeds(t *testing.T) {
	mem, frames, runtime, fill := modulesLoop()
	fuzzseed.Write(t, "FuzzFrames", []fuzzseed.Seed{
		fuzzseed.Of("regression-sys-modules-loop", mem, frames, []byte{}, uint8(0), runtime, fill),
	})
	if !fuzzseed.Recording(t, "FuzzFrames python3.*, FuzzLineTable") {
		return
	}
	var seeds, tables []fuzzseed.Seed
	for vi, v := range fuzzVersions {
		segs, frames, p := recordFrames(t, v)
		layout, err := binary.Append(nil, binary.LittleEndian, p.Layout)
		if err != nil {
			t.Fatal(err)
		}
		mem, fs := encodeSegments(segs), encodeFrames(frames)
		seeds = append(seeds,
			fuzzseed.Of("python"+v, mem, fs, layout, uint8(vi), p.Runtime, []byte{}),
			fuzzseed.Of("python"+v+"-filled", mem, fs, layout, uint8(vi), p.Runtime, []byte{0x40}))
		if v != "3.10" { // 3.10's memory is large (sys.modules); its layout is in the others'
			seeds = append(seeds, fuzzseed.Of("python"+v+"-layout-from-file", mem, fs, layout, uint8(len(fuzzVersions)), p.Runtime, []byte{}))
		}
		r := resolverOver(&segmentMemory{segs: segs}, p.Layout, p.Runtime)
		for i, f := range frames {
			if c := r.procs[1].code(f.Code); c.err == nil && i < 4 {
				tables = append(tables, fuzzseed.Of(fmt.Sprintf("python%s-%d", v, i), c.linetable, c.firstLine, i*3))
			}
		}
	}
	fuzzseed.Write(t, "FuzzFrames", seeds)
	fuzzseed.Write(t, "FuzzLineTable", tables)
}

// recordFrames names framesScript's cases in a live interpreter of version
// v and returns the memory read, the frames and the process.
func recordFrames(t *testing.T, v string) ([]segment, []tracer.PyFrame, *Process) {
	python := filepath.Join(pyenvVersions[v], "bin/python"+v)
	script := filepath.Join(t.TempDir(), "frames.py")
	if err := os.WriteFile(script, []byte(framesScript), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "-S", script) // without site: fewer modules for 3.10 to read
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	var frames []tracer.PyFrame
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if f[0] == "end" {
			break
		}
		code, _ := strconv.ParseUint(f[0], 10, 64)
		class, _ := strconv.ParseUint(f[1], 10, 64)
		frames = append(frames, tracer.PyFrame{Code: code, Class: class})
	}
	p, err := Detect("/proc", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// An instruction a few in: f_lasti for 3.10, a pointer into the code
	// for 3.11+.
	for i := range frames {
		frames[i].Instr = 4
		if p.Layout.InstrSize == 8 {
			frames[i].Instr = frames[i].Code + uint64(p.Layout.CodeAdaptive) + 8
		}
	}
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(p.PID), "mem"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rec := &recorder{r: f}
	r := resolverOver(rec, p.Layout, p.Runtime)
	out := r.Frames(1, frames)
	want := []string{"Loader.Shard.pin", "Loader.Shard.open", "Loader.Shard.size", "Loader.Shard.nbytes", "outer.<locals>.inner",
		"deco.<locals>.wrapper", "größe", "加载", "<lambda>", "<listcomp>"}
	for i, fr := range out {
		if w := want[i]; fr.Function != w && !(v == "3.10" && strings.HasSuffix(w, "."+fr.Function)) && fr.Function != "<module>" {
			t.Errorf("%s: frame %d named %q, want %q", v, i, fr.Function, w)
		}
	}
	return rec.merged(), frames, p
}
