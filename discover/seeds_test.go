//go:build fuzzseed

// The seed corpora of discover's fuzz targets (testdata/fuzz), written by
// go generate -tags fuzzseed (make fuzz-seeds), not by go test.

package discover

//go:generate go test -tags fuzzseed -run ^TestWriteSeeds$ -count=1 .

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

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

// TestWriteSeeds writes FuzzParseMapsLine's and FuzzLibrariesIn's seeds:
// the lines above, one by one and as one process's maps, and with
// GPUMEM_RECORD_SEEDS=1 a live CPython's whole maps and FuzzParseStat's
// stat files of live processes.
func TestWriteSeeds(t *testing.T) {
	var lines []fuzzseed.Seed
	for i, l := range mapsLines {
		lines = append(lines, fuzzseed.Of(fmt.Sprintf("line-%02d", i), l))
	}
	fuzzseed.Write(t, "FuzzParseMapsLine", lines)
	files := []fuzzseed.Seed{fuzzseed.Of("cuda-process", []byte(strings.Join(mapsLines, "\n")+"\n")),
		// Found: a path with ".." led out of the process's root (fixed by underRoot).
		fuzzseed.Of("regression-dotdot", []byte("7f00-7f10 r-xp 00000000 00:2a 99 /../../../usr/lib/libcuda.so.1\n"))}
	if fuzzseed.Recording(t, "FuzzLibrariesIn python3") {
		out, err := exec.Command("python3", "-c", "import sys; sys.stdout.write(open('/proc/self/maps').read())").Output()
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, fuzzseed.Of("python3", out))
	}
	fuzzseed.Write(t, "FuzzLibrariesIn", files)
	if fuzzseed.Recording(t, "FuzzParseStat") {
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
}
