// Package gpuinfo names the GPUs behind CUDA device ordinals, from the
// NVIDIA driver's own description of them (/proc/driver/nvidia/gpus). Where
// it cannot tell which GPU an ordinal is, it says nothing.
package gpuinfo

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// DriverDir is where the NVIDIA kernel driver describes its GPUs.
const DriverDir = "/proc/driver/nvidia/gpus"

// Device is one GPU as the driver describes it.
type Device struct {
	Name string // Model, "NVIDIA H200"
	UUID string // "GPU-87739fb2-..."
	Bus  string // PCI bus location, "0000:18:00.0"
}

// Devices reads the driver's GPUs in PCI bus order; none when there is no
// NVIDIA driver.
func Devices(dir string) []Device {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var devs []Device
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name(), "information"))
		if err != nil {
			continue
		}
		d := Device{Bus: e.Name()}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			key, value, ok := strings.Cut(sc.Text(), ":")
			value = strings.TrimSpace(value)
			switch {
			case !ok:
			case key == "Model":
				d.Name = value
			case key == "GPU UUID":
				d.UUID = value
			case key == "Bus Location":
				d.Bus = value
			}
		}
		devs = append(devs, d)
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].Bus < devs[j].Bus })
	return devs
}

// Ordinals maps a process's CUDA device ordinals to GPUs, given its
// environment. CUDA numbers the devices CUDA_VISIBLE_DEVICES lists (indexes
// or UUIDs), in PCI bus order when CUDA_DEVICE_ORDER=PCI_BUS_ID, else fastest
// first: identical GPUs then keep their bus order. On a mix of models
// without PCI_BUS_ID the order is unknown, and so is the mapping: nil.
func Ordinals(devs []Device, environ []string) map[int]Device {
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	if env["CUDA_DEVICE_ORDER"] != "PCI_BUS_ID" && !sameModel(devs) {
		return nil
	}
	visible := devs
	if list, ok := env["CUDA_VISIBLE_DEVICES"]; ok {
		visible = nil
		for _, item := range strings.Split(list, ",") {
			d, ok := lookup(devs, strings.TrimSpace(item))
			if !ok {
				break // CUDA ignores the list from the first invalid item on
			}
			visible = append(visible, d)
		}
	}
	m := make(map[int]Device, len(visible))
	for i, d := range visible {
		m[i] = d
	}
	return m
}

func lookup(devs []Device, item string) (Device, bool) {
	if item == "" {
		return Device{}, false
	}
	if i, err := strconv.Atoi(item); err == nil {
		if i >= 0 && i < len(devs) {
			return devs[i], true
		}
		return Device{}, false
	}
	for _, d := range devs {
		if strings.HasPrefix(d.UUID, item) || strings.HasPrefix(d.UUID, "GPU-"+item) {
			return d, true
		}
	}
	return Device{}, false
}

func sameModel(devs []Device) bool {
	for _, d := range devs {
		if d.Name != devs[0].Name {
			return false
		}
	}
	return true
}
