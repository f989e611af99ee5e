//go:build fuzzseed

// The seed corpora of container's fuzz targets (testdata/fuzz), written by
// go generate -tags fuzzseed (make fuzz-seeds), not by go test.

package container

//go:generate go test -tags fuzzseed -run ^TestWriteSeeds$ -count=1 .

import (
	"testing"

	"github.com/gpu-mem/gpu-mem/internal/fuzzseed"
)

const (
	seedUID = "5f3b8a1e-2c4d-4e6f-8a0b-1c2d3e4f5a6b"
	seedID  = "3f8a2b1c9d0e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a"
	otherID = "aaaa2b1c9d0e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a"
)

// cgroupFiles are /proc/PID/cgroup as kubelet and the runtimes lay them
// out (cgroup_test.go), a host process, and a process that made cgroups
// of its own under its container's (cgroup delegation).
var cgroupFiles = map[string]string{
	"v2-systemd-containerd": "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5f3b8a1e_2c4d_4e6f_8a0b_1c2d3e4f5a6b.slice/cri-containerd-" + seedID + ".scope\n",
	"v2-systemd-crio":       "0::/kubepods.slice/kubepods-pod5f3b8a1e_2c4d_4e6f_8a0b_1c2d3e4f5a6b.slice/crio-" + seedID + ".scope\n",
	"v2-cgroupfs":           "0::/kubepods/besteffort/pod" + seedUID + "/" + seedID + "\n",
	"v1-cgroupfs-docker": "12:pids:/kubepods/burstable/pod" + seedUID + "/" + seedID + "\n11:memory:/kubepods/burstable/pod" + seedUID + "/" + seedID +
		"\n10:cpuset:/kubepods/burstable/pod" + seedUID + "/" + seedID + "\n1:name=systemd:/kubepods/burstable/pod" + seedUID + "/" + seedID + "\n",
	"v1-systemd-docker": "9:name=systemd:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod5f3b8a1e_2c4d_4e6f_8a0b_1c2d3e4f5a6b.slice/docker-" + seedID + ".scope\n",
	"pod-sandbox":       "0::/kubepods/pod" + seedUID + "\n",
	"host-session":      "0::/user.slice/user-0.slice/session-1.scope\n",
	"docker-no-k8s":     "0::/system.slice/docker-" + seedID + ".scope\n",
	"nested-init-scope": "0::/kubepods/besteffort/pod" + seedUID + "/" + seedID + "/init.scope\n",
	"empty":             "",
}

// TestWriteSeeds writes FuzzFromCgroupFile's seeds: cgroupFiles, each with
// a child cgroup, and the regression.
func TestWriteSeeds(t *testing.T) {
	var cgroups []fuzzseed.Seed
	for name, file := range cgroupFiles {
		cgroups = append(cgroups, fuzzseed.Of(name, []byte(file), "child"))
	}
	// Found: a process allowed to make cgroups under its container's named
	// one after another pod and container, and was taken for them (the last
	// pod and container named won). Fixed: the first pod, and the element
	// right under it.
	cgroups = append(cgroups, fuzzseed.Of("regression-nested-pod", []byte(cgroupFiles["v2-cgroupfs"]), "pod11111111-2222-3333-4444-555555555555/"+otherID))
	fuzzseed.Write(t, "FuzzFromCgroupFile", cgroups)
}
