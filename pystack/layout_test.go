package pystack

import (
	"bufio"
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/tracer"
)

// pyenvVersions are the interpreters of ../shared/DESIGN.md with headers.
var pyenvVersions = map[string]string{
	"3.10": "/root/.pyenv/versions/3.10.13",
	"3.11": "/root/.pyenv/versions/3.11.7",
	"3.12": "/root/.pyenv/versions/3.12.1",
	"3.13": "/root/.pyenv/versions/3.13.0",
}

// headerOffsets compiles testdata/offsets.c against a version's headers and
// returns what it prints.
func headerOffsets(t *testing.T, prefix, minor string) map[string]uint64 {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "offsets")
	out, err := exec.Command("cc", "-I", filepath.Join(prefix, "include", "python"+minor), "-o", bin, "testdata/offsets.c").CombinedOutput()
	if err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	out, err = exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	offsets := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("bad line %q", sc.Text())
		}
		offsets[k] = n
	}
	return offsets
}

func TestLayoutsMatchHeaders(t *testing.T) {
	for minor, prefix := range pyenvVersions {
		t.Run(minor, func(t *testing.T) {
			h := headerOffsets(t, prefix, minor)
			l := layouts[minor]
			field := func(name string) uint64 {
				if v, ok := h[name]; ok {
					return v
				}
				return tracer.PyNoField
			}
			for name, got := range map[string]uint16{
				"runtime_interpreters_head": l.RuntimeInterpretersHead,
				"interp_next":               l.InterpNext,
				"interp_threads_head":       l.InterpThreadsHead,
				"tstate_next":               l.TstateNext,
				"tstate_interp":             l.TstateInterp,
				"tstate_thread_id":          l.TstateThreadID,
				"tstate_frame":              l.TstateFrame,
				"cframe_current_frame":      l.CframeCurrentFrame,
				"frame_previous":            l.FramePrevious,
				"frame_code":                l.FrameCode,
				"frame_instr":               l.FrameInstr,
				"frame_owner":               l.FrameOwner,
				"frame_is_entry":            l.FrameIsEntry,
				"frame_localsplus":          l.FrameLocalsplus,
				"type_flags":                l.TypeFlags,
				"tstate_datastack_chunk":    l.TstateDatastackChunk,
				"code_filename":             l.CodeFilename,
				"code_name":                 l.CodeName,
				"code_qualname":             l.CodeQualname,
				"code_firstlineno":          l.CodeFirstlineno,
				"code_linetable":            l.CodeLinetable,
				"code_adaptive":             l.CodeAdaptive,
				"code_varnames":             l.CodeVarnames,
				"unicode_ascii_size":        l.UnicodeASCII,
				"unicode_compact_size":      l.UnicodeCompact,
				"bytes_sval":                l.BytesData,
				"tuple_item":                l.TupleItems,
				"type_name":                 l.TypeName,
			} {
				if want := field(name); uint64(got) != want {
					t.Errorf("%s: layout says %d, headers %d", name, got, want)
				}
			}
			if minor != "3.10" {
				if l.Names310 != (Names310{}) {
					t.Errorf("Names310 set: %+v", l.Names310)
				}
				return
			}
			n := l.Names310
			for name, got := range map[string]uint16{
				"interp_modules":     n.InterpModules,
				"module_dict":        n.ModuleDict,
				"type_dict":          n.TypeDict,
				"type_mro":           n.TypeMro,
				"heap_type_qualname": n.HeapTypeQualname,
				"dict_version":       n.DictVersion,
				"dict_keys":          n.DictKeys,
				"dict_values":        n.DictValues,
				"func_code":          n.FuncCode,
				"func_qualname":      n.FuncQualname,
			} {
				if want, ok := h[name]; !ok || uint64(got) != want {
					t.Errorf("%s: layout says %d, headers %d (printed: %v)", name, got, want, ok)
				}
			}
		})
	}
}

// TestDebugOffsets313 reads 3.13's _Py_DebugOffsets from its library: the
// layout it describes is the one the headers give.
func TestDebugOffsets313(t *testing.T) {
	f, err := elf.Open(filepath.Join(pyenvVersions["3.13"], "lib/libpython3.13.so.1.0"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sym, ok := lookupSymbol(f, "_PyRuntime")
	if !ok {
		t.Fatal("no _PyRuntime")
	}
	// Start from an empty layout: every value must come from the file.
	got, err := debugOffsets(f, sym, Layout{})
	if err != nil {
		t.Fatal(err)
	}
	want := layouts["3.13"]
	want.CframeCurrentFrame, want.FrameIsEntry, want.FrameLocalsplus, want.TypeFlags = 0, 0, 0, 0
	want.InstrSize, want.OwnerCstack, want.CodeVarnames = 0, 0, 0
	want.UnicodeASCII, want.UnicodeCompact, want.BytesData, want.TupleItems = 0, 0, 0, 0
	if !reflect.DeepEqual(got, want) {
		t.Errorf("debug offsets\n%+v\nwant\n%+v", got, want)
	}
}

func TestDetectRejectsOtherProcesses(t *testing.T) {
	if _, err := Detect("/proc", os.Getpid()); err != ErrNotPython {
		t.Errorf("Detect(self) = %v, want ErrNotPython", err)
	}
	if _, err := Detect("/proc", 1<<30); err == nil {
		t.Error("Detect of a missing process succeeded")
	}
}

// TestFieldsReadAtOnce: every version's thread state and frame fields lie
// in the bytes the BPF program reads of them at once, those it loads as 8
// bytes aligned, and a layout with one outside them or misaligned is
// refused.
func TestFieldsReadAtOnce(t *testing.T) {
	for version, l := range layouts {
		if err := l.checkReadAtOnce(); err != nil {
			t.Errorf("%s: %v", version, err)
		}
	}
	for _, c := range []struct {
		change func(*Layout)
		want   string
	}{
		{func(l *Layout) { l.FrameOwner = frameMin }, "a frame's owner at offset 72: outside the 72 bytes from 0 read at once"},
		{func(l *Layout) { l.TstateDatastackChunk = 72 + tstateHead - 4 }, "a thread state's data stack chunk at offset 324: outside the 256 bytes from 72 read at once"},
		{func(l *Layout) { l.TstateThreadID = 64 }, "a thread state's thread id at offset 64: outside the 256 bytes from 72 read at once"},
		{func(l *Layout) { l.TstateThreadID = 156 }, "a thread state's thread id at offset 156: not a multiple of 8 bytes from 72"},
		{func(l *Layout) { l.FrameInstr = 60 }, "a frame's instruction at offset 60: not a multiple of 8 bytes from 0"},
	} {
		l := layouts["3.13"]
		c.change(&l)
		if err := l.checkReadAtOnce(); err == nil || err.Error() != c.want {
			t.Errorf("%v, want %s", err, c.want)
		}
	}
}
