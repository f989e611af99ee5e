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
		{Name: "NVIDIA H200", UUID: "GPU-f2439028-1e88-53e4-af5e-775f76f6d6f1", Bus: "0000:00:06.0"},
		{Name: "NVIDIA H200", UUID: "GPU-4b04ee3e-2ae6-e7b1-5a3a-88a122e84198", Bus: "0000:00:07.0"},
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
		{nil, []string{"0000:00:06.0", "0000:00:07.0"}},
		{[]string{"CUDA_VISIBLE_DEVICES=1"}, []string{"0000:00:07.0"}},
		{[]string{"CUDA_VISIBLE_DEVICES=1,0"}, []string{"0000:00:07.0", "0000:00:06.0"}},
		{[]string{"CUDA_VISIBLE_DEVICES=GPU-4b04ee3e"}, []string{"0000:00:07.0"}},
		{[]string{"CUDA_VISIBLE_DEVICES=0,7,1"}, []string{"0000:00:06.0"}},
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
	mixed := append(devs, Device{Name: "NVIDIA L4", Bus: "0000:00:08.0"})
	if m := Ordinals(mixed, nil); m != nil {
		t.Errorf("mixed models, fastest first: %v", m)
	}
	if m := Ordinals(mixed, []string{"CUDA_DEVICE_ORDER=PCI_BUS_ID"}); m[2].Name != "NVIDIA L4" {
		t.Errorf("PCI_BUS_ID order: %v", m)
	}
}
