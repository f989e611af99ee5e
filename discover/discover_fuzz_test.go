package discover

import (
	"fmt"
	"strings"
	"testing"
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
