package pystack

import (
	"bytes"
	"debug/elf"
	"testing"
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
