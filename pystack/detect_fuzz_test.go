package pystack

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/internal/fuzzseed"
)

// FuzzDetect: any file mapped as a CPython interpreter gives a runtime
// address and layout, or an error; for 3.13 the layout is read from the
// file's _Py_DebugOffsets, whatever it says.
func FuzzDetect(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, version string, start uint64) {
		ef, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return
		}
		p, err := detectFile(ef, start, version)
		if err != nil || p == nil {
			return
		}
		if _, ok := layouts[version]; !ok {
			t.Fatalf("a process of unsupported version %q", version)
		}
		p.Walk()
	})
}

// runtimeLibrary is a libpython that exports _PyRuntime; with debugOffsets,
// starting with 3.13's _Py_DebugOffsets (cookie, version, free-threading,
// then the offsets debugOffsets reads, at their indexes).
func runtimeLibrary(debugOffsets bool) string {
	if !debugOffsets {
		return "char _PyRuntime[4096] = {1};\n"
	}
	l := layouts["3.13"]
	words := make([]uint64, 50)
	copy(words, []uint64{0x7970677562656478, 0x030d00f0, 0}) // "xdebugpy"
	for i, v := range map[int]uint16{5: l.RuntimeInterpretersHead, 8: l.InterpNext, 9: l.InterpThreadsHead, 21: l.TstateNext,
		22: l.TstateInterp, 23: l.TstateFrame, 24: l.TstateThreadID, 29: l.FramePrevious, 30: l.FrameCode, 31: l.FrameInstr,
		33: l.FrameOwner, 35: l.CodeFilename, 36: l.CodeName, 37: l.CodeQualname, 38: l.CodeLinetable, 39: l.CodeFirstlineno,
		43: l.CodeAdaptive, 47: l.TypeName} {
		words[i] = uint64(v)
	}
	var init []string
	for _, w := range words {
		init = append(init, fmt.Sprintf("%#xULL", w))
	}
	return "unsigned long long _PyRuntime[512] = {" + strings.Join(init, ", ") + "};\n"
}

func TestWriteDetectSeeds(t *testing.T) {
	if os.Getenv("GPUMEM_WRITE_SEEDS") != "1" {
		t.Skip("GPUMEM_WRITE_SEEDS=1 writes the seed corpora")
	}
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
		if out, err := exec.Command("cc", "-shared", "-fPIC", "-s", "-o", lib, src).CombinedOutput(); err != nil {
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
