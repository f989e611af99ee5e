package discover

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/internal/fuzzseed"
)

// mapsLines are real /proc/PID/maps lines: the driver and torch's
// allocator as a CUDA process on the H200 maps them, a pip wheel's and a
// container's copies, CPython, the kernel's own regions, anonymous code, a
// deleted file and a path with spaces.
var mapsLines = []string{
	"7f1c2a000000-7f1c2a200000 r-xp 00001000 fd:01 1234567                    /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04",
	"7f6b1c400000-7f6b1c4a2000 r-xp 0003e000 00:2d 5243081                    /usr/local/lib/python3.12/dist-packages/torch/lib/libc10_cuda.so",
	"7f6b20a00000-7f6b20a26000 r--p 00000000 00:2d 5243080                    /opt/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib/libcudart.so.13",
	"55d0c3a00000-55d0c3b2e000 r-xp 00061000 fe:00 247105                     /usr/bin/python3.12",
	"7fc8863b6000-7fc88650c000 r-xp 00026000 fe:00 326269                     /usr/lib/x86_64-linux-gnu/libc.so.6",
	"7f2a10200000-7f2a104f4000 r-xp 000b7000 fe:00 5371022                    /root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0",
	"7f00-7f10 r-xp 00000000 00:2a 99 /opt/my venv/lib/libcuda.so.1 (deleted)",
	"55a610871000-55a610892000 rw-p 00000000 00:00 0                          [heap]",
	"7ffd4b9e1000-7ffd4ba02000 rw-p 00000000 00:00 0                          [stack]",
	"7ffd4bbd4000-7ffd4bbd6000 r-xp 00000000 00:00 0                          [vdso]",
	"ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]",
	"7fc886310000-7fc886332000 rwxp 00000000 00:00 0 ",
	"7f3a61e00000-7f3a62000000 r-xp 00000000 00:01 3122                       /memfd:cuda-jit (deleted)",
}

func TestWriteMapsSeeds(t *testing.T) {
	var lines, files []fuzzseed.Seed
	for i, l := range mapsLines {
		lines = append(lines, fuzzseed.Of(fmt.Sprintf("line-%02d", i), l))
	}
	fuzzseed.Write(t, "FuzzParseMapsLine", lines)
	// A live CPython's whole maps, and the lines above as one process's.
	out, err := exec.Command("python3", "-c", "import sys; sys.stdout.write(open('/proc/self/maps').read())").Output()
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, fuzzseed.Of("python3", out), fuzzseed.Of("cuda-process", []byte(strings.Join(mapsLines, "\n")+"\n")),
		// Found: a path with ".." led out of the process's root (fixed by underRoot).
		fuzzseed.Of("regression-dotdot", []byte("7f00-7f10 r-xp 00000000 00:2a 99 /../../../usr/lib/libcuda.so.1\n")))
	fuzzseed.Write(t, "FuzzLibrariesIn", files)
}

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

func TestWriteStatSeeds(t *testing.T) {
	own, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	kthread, err := os.ReadFile("/proc/2/stat")
	if err != nil {
		t.Fatal(err)
	}
	fuzzseed.Write(t, "FuzzParseStat", []fuzzseed.Seed{
		fuzzseed.Of("own", own), fuzzseed.Of("kthread", kthread),
		fuzzseed.Of("comm-with-parens", []byte(strings.Replace(string(own), "(", "(a) b (", 1))),
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
