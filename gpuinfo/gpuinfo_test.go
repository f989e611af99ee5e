package gpuinfo

import (
	"reflect"
	"testing"
)

// testdata/gpus holds two H200s as the driver describes them (recorded on
// the GPU machine of docs/validation.md): no NVIDIA driver exists here.
func TestDevicesInBusOrder(t *testing.T) {
	devs := Devices("testdata/gpus")
	want := []Device{
		{Name: "NVIDIA H200", UUID: "GPU-87739fb2-59e0-dc07-f453-3dd482cb2d9d", Bus: "0000:18:00.0"},
		{Name: "NVIDIA H200", UUID: "GPU-18d89315-7b04-1d79-e438-9f37e5ad46d9", Bus: "0000:2a:00.0"},
	}
	if !reflect.DeepEqual(devs, want) {
		t.Errorf("%+v", devs)
	}
	if Devices("testdata/none") != nil {
		t.Error("devices without a driver")
	}
}

func TestOrdinals(t *testing.T) {
	devs := Devices("testdata/gpus")
	for _, tc := range []struct {
		env  []string
		want []string // bus of ordinal 0, 1, ...
	}{
		{nil, []string{"0000:18:00.0", "0000:2a:00.0"}},
		{[]string{"CUDA_VISIBLE_DEVICES=1"}, []string{"0000:2a:00.0"}},
		{[]string{"CUDA_VISIBLE_DEVICES=1,0"}, []string{"0000:2a:00.0", "0000:18:00.0"}},
		{[]string{"CUDA_VISIBLE_DEVICES=GPU-18d89315"}, []string{"0000:2a:00.0"}},
		{[]string{"CUDA_VISIBLE_DEVICES=0,7,1"}, []string{"0000:18:00.0"}},
		{[]string{"CUDA_VISIBLE_DEVICES="}, []string{}},
	} {
		m := Ordinals(devs, tc.env)
		var got []string
		for i := range len(m) {
			got = append(got, m[i].Bus)
		}
		if len(got) != len(tc.want) || (len(got) > 0 && !reflect.DeepEqual(got, tc.want)) {
			t.Errorf("%v: %v, want %v", tc.env, got, tc.want)
		}
	}
	mixed := append(devs, Device{Name: "NVIDIA L4", Bus: "0000:3b:00.0"})
	if m := Ordinals(mixed, nil); m != nil {
		t.Errorf("mixed models, fastest first: %v", m)
	}
	if m := Ordinals(mixed, []string{"CUDA_DEVICE_ORDER=PCI_BUS_ID"}); m[2].Name != "NVIDIA L4" {
		t.Errorf("PCI_BUS_ID order: %v", m)
	}
}
