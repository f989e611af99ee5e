package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/profiler"
)

const MiB = 1 << 20

// TestEveryByteOnItsDevice: threads allocate on devices 0, 1 and 2, switching
// contexts with cuDevicePrimaryCtxRetain + cuCtxSetCurrent, cuCtxCreate_v2,
// _v3 and _v4, cuCtxPushCurrent_v2 and cuCtxPopCurrent_v2; VMM memory names
// its device, or the host; host and managed memory are labelled as such.
func TestEveryByteOnItsDevice(t *testing.T) {
	w := startWorkload(t, []string{"SIMCUDA_DEVICES=3"}, simwork, "devices")
	s := startProfiler(t, profiler.Config{Library: simLib}, w)
	w.run()
	r := s.report()
	type where struct {
		gpu  string
		kind memory.Kind
	}
	live := map[where]uint64{}
	for _, row := range r.Rows() {
		if row.PID == uint32(w.pid) {
			live[where{row.GPU(), row.Kind}] += row.LiveBytes()
		}
	}
	want := map[where]uint64{
		{"0", memory.KindDevice}:        5*MiB + 13*MiB,
		{"1", memory.KindDevice}:        2*MiB + 11*MiB + 17*MiB,
		{"2", memory.KindDevice}:        3*MiB + 7*MiB,
		{"2", memory.KindVMM}:           19 * MiB,
		{"host", memory.KindVMM}:        6 * MiB,
		{"host", memory.KindHost}:       4096,
		{"managed", memory.KindManaged}: 8192,
	}
	if len(live) != len(want) {
		t.Errorf("live %v, want %v", live, want)
	}
	for k, v := range want {
		if live[k] != v {
			t.Errorf("gpu %s %s: %d bytes, want %d", k.gpu, k.kind, live[k], v)
		}
	}
	assertNoLosses(t, r)
	w.exit()
}

// TestGPUFilterAndLabels: --gpu 1 keeps device 1's memory only, and every
// output names the device.
func TestGPUFilterAndLabels(t *testing.T) {
	out := filepath.Join(t.TempDir(), "gpu1.json")
	w := startWorkload(t, []string{"SIMCUDA_DEVICES=3"}, simwork, "devices")
	c := startCLI(t, "record", "--pid", strconv.Itoa(w.pid), "--gpu", "1", "--format", "json", "-o", out)
	c.waitEvent(logs.Attached, "kind", "driver")
	w.run()
	c.interrupt()
	w.exit()
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Stacks []struct {
			GPU       string `json:"gpu"`
			LiveBytes uint64 `json:"live_bytes"`
		}
	}
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	var total uint64
	for _, s := range r.Stacks {
		if s.GPU != "1" {
			t.Errorf("stack on gpu %q", s.GPU)
		}
		total += s.LiveBytes
	}
	if total != 30*MiB {
		t.Errorf("gpu 1 holds %d bytes, want %d", total, 30*MiB)
	}
}
