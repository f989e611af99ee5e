package discover

import (
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
)

func TestParseMapsLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Mapping
		ok   bool
	}{
		{
			"7f1c2a000000-7f1c2a200000 r-xp 00001000 fd:01 1234567 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04",
			Mapping{Start: 0x7f1c2a000000, End: 0x7f1c2a200000, Perms: "r-xp", Offset: 0x1000, Dev: "fd:01", Inode: 1234567, Path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"},
			true,
		},
		{
			"7f00-7f10 r-xp 00000000 00:2a 99 /opt/my venv/lib/libcuda.so.1 (deleted)",
			Mapping{Start: 0x7f00, End: 0x7f10, Perms: "r-xp", Dev: "00:2a", Inode: 99, Path: "/opt/my venv/lib/libcuda.so.1", Deleted: true},
			true,
		},
		{"7ffd-7ffe rw-p 00000000 00:00 0 [stack]", Mapping{Start: 0x7ffd, End: 0x7ffe, Perms: "rw-p", Dev: "00:00", Path: "[stack]"}, true},
		{"7ffd-7ffe r-xp 00000000 00:00 0", Mapping{Start: 0x7ffd, End: 0x7ffe, Perms: "r-xp", Dev: "00:00"}, true},
		{"7ffd-7ffe r-xp 00000000 00:00", Mapping{}, false},
		{"garbage", Mapping{}, false},
	} {
		got, ok := ParseMapsLine(tc.line)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%q: %+v %v, want %+v %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

func TestIsDriverLibrary(t *testing.T) {
	for path, want := range map[string]bool{
		"/usr/lib/libcuda.so":                   true,
		"/x/libcuda.so.1":                       true,
		"/x/libcuda.so.580.159.04":              true,
		"/x/libcudart.so.12":                    false,
		"/x/libcuda.sox":                        false,
		"/site-packages/nvidia/libcuda_stub.so": false,
	} {
		if got := IsDriverLibrary(path); got != want {
			t.Errorf("%s: %v", path, got)
		}
	}
}

func TestPythonVersion(t *testing.T) {
	for path, want := range map[string]string{
		"/usr/bin/python3.11": "3.11",
		"/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0": "3.12",
		"/usr/lib/x86_64-linux-gnu/libpython3.10.so.1.0":        "3.10",
		"/usr/bin/python-config":                                "",
		"/x/mypython3.12":                                       "",
	} {
		if got, _ := PythonVersion(path); got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
}

// TestScanWhileProcessesExit scans /proc while short-lived processes come
// and go, with Scan and a Scanner: no error, no crash. It scans until 100
// processes have come and gone during its scans, however slow the machine.
func TestScanWhileProcessesExit(t *testing.T) {
	stop := make(chan struct{})
	var spawned atomic.Int64
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				exec.Command("true").Run()
				spawned.Add(1)
			}
		}
	}()
	defer close(stop)
	scanner := NewScanner("/proc", "")
	scans := 0
	waitfor.Condition(t, "100 processes spawned during two scans", 2*time.Minute, func() bool {
		if _, err := Scan("/proc", nil); err != nil {
			t.Fatalf("scan %d: %v", scans, err)
		}
		if _, err := scanner.Scan(nil); err != nil {
			t.Fatalf("scanner's scan %d: %v", scans, err)
		}
		scans++
		return spawned.Load() >= 100 && scans >= 2
	})
	// A pid that does not exist is skipped, not an error.
	if r, err := Scan("/proc", []int{os.Getpid(), 1 << 30}); err != nil || len(r.Libraries) != 0 || len(r.Python) != 0 {
		t.Fatalf("%+v %v", r, err)
	}
	if r, err := NewScanner("/proc", "").Scan([]int{os.Getpid(), 1 << 30}); err != nil || len(r.Libraries) != 0 || len(r.Python) != 0 {
		t.Fatalf("scanner: %+v %v", r, err)
	}
}
