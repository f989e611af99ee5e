package discover

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzParseMapsLine: any line parses or is refused; a parsed line printed
// as the kernel prints it parses to the same mapping.
func FuzzParseMapsLine(f *testing.F) {
	f.Fuzz(func(t *testing.T, line string) {
		m, ok := ParseMapsLine(line)
		if !ok {
			return
		}
		IsDriverLibrary(m.Path)
		IsAllocatorLibrary(m.Path)
		PythonVersion(m.Path)
		again := fmt.Sprintf("%x-%x %s %08x %s %d %s", m.Start, m.End, m.Perms, m.Offset, m.Dev, m.Inode, m.Path)
		if m.Deleted {
			again += " (deleted)"
		}
		if m2, ok := ParseMapsLine(again); !ok || m2 != m {
			t.Fatalf("%q: %+v; printed %q: %+v %v", line, m, again, m2, ok)
		}
	})
}

// FuzzLibrariesIn: any maps file yields driver and allocator libraries
// only, each at a path under the process's root.
func FuzzLibrariesIn(f *testing.F) {
	const root = "/proc/42/root"
	f.Fuzz(func(t *testing.T, data []byte) {
		libs, _ := librariesIn(data, root)
		for _, lib := range libs {
			if !strings.HasPrefix(lib.Path, root+"/") || strings.Contains(lib.Path, "/../") {
				t.Fatalf("library %+v outside %s", lib, root)
			}
			if !IsDriverLibrary(lib.Path) && !IsAllocatorLibrary(lib.Path) {
				t.Fatalf("library %+v is neither the driver nor the allocator", lib)
			}
		}
	})
}

// FuzzParseStat: any stat file parses or is refused; a parsed one written
// back as the kernel writes it parses to the same.
func FuzzParseStat(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := parseStat(data)
		if err != nil {
			return
		}
		fields := slices.Repeat([]string{"0"}, 50)
		fields[22-3] = strconv.FormatUint(uint64(st.start/(time.Second/userHZ)), 10)
		fields[23-3] = strconv.FormatUint(st.vsize, 10)
		fields[26-3] = strconv.FormatUint(st.program.code, 10)
		again := fmt.Sprintf("1 (%s) %s\n", st.program.comm, strings.Join(fields, " "))
		if st2, err := parseStat([]byte(again)); err != nil || st2 != st {
			t.Fatalf("%q: %+v; written %q: %+v %v", data, st, again, st2, err)
		}
	})
}
