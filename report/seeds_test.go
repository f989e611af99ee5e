//go:build fuzzseed

// The seed corpora of report's fuzz targets (testdata/fuzz), written by
// go generate -tags fuzzseed (make fuzz-seeds), not by go test.

package report

//go:generate go test -tags fuzzseed -run ^TestWriteSeeds$ -count=1 .

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/internal/fuzzseed"
)

// hostileSeeds are names seen in the wild and made to break writers.
var hostileSeeds = []names{
	{"python3", "GPUModelRunner._allocate_kv_cache_tensors", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", "/srv/vllm/worker/gpu_model_runner.py", "/usr/local/lib/python3.12/dist-packages/torch/lib/libc10_cuda.so", "vllm-7c9d5b8f4-qx2lp"},
	{"pt_main_thread", "</script><script>alert(1)</script>", "<img src=x onerror=alert(1)>", "<!--", "]]><![CDATA[", "\"'><svg/onload=alert(1)>"},
	{"python3", "\u2028\u2029", "</SCRIPT >", "</scr\x00ipt>", "<\\/script>", "&lt;script&gt;"},
	{"a;b", "load;weights", "x;y;z", "file;name.py", "/lib/a;b.so", "ns;pod"},
	{"py\nthon", "load\nweights 123", "f\r\ng", "a.py\n", "/lib/x\n.so", "pod\nname"},
	{"\x1b]0;owned\x07", "\x1b[2J\x1b[31mred", "tab\there", "\x00nul", "\x7fdel", "\u009bcsi"},
	{"\xff\xfe", "\xc0\x80", "\xed\xa0\x80", "valid \xe2\x82", "\xf4\x90\x80\x80", "\x80"},
	{"", "", "", "", "", ""},
	{"gpu=0", "gpu=host", " 12345", "%s%n%x", "{{.}}", "${jndi:x}"},
	{strings.Repeat("c", 16), strings.Repeat("A<B<", 2000), strings.Repeat("\u00e9", 500), strings.Repeat("/", 300), strings.Repeat("../", 100), strings.Repeat("p", 253)},
}

var writerTargets = []string{"FuzzHTML", "FuzzFolded", "FuzzJSON", "FuzzTop", "FuzzPprof"}

// TestWriteSeeds writes hostileSeeds for each writer's target.
func TestWriteSeeds(t *testing.T) {
	var seeds []fuzzseed.Seed
	for i, n := range hostileSeeds {
		name := fmt.Sprintf("names-%02d", i)
		switch i {
		case 3:
			name = "regression-folded-separators"
		case 4:
			name = "regression-folded-line-breaks"
		case 5:
			name = "regression-top-control-characters"
		}
		seeds = append(seeds, fuzzseed.Of(name, n.comm, n.fn1, n.fn2, n.file, n.module, n.pod))
	}
	for _, target := range writerTargets {
		fuzzseed.Write(t, target, seeds)
	}
}
