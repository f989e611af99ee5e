package container

import "testing"

func TestFromCgroupFile(t *testing.T) {
	const id = "3f8a2b1c9d0e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a"
	const uid = "5f3b8a1e-2c4d-4e6f-8a0b-1c2d3e4f5a6b"
	for name, tc := range map[string]struct {
		file string
		want Identity
	}{
		"v2 systemd containerd": {"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5f3b8a1e_2c4d_4e6f_8a0b_1c2d3e4f5a6b.slice/cri-containerd-" + id + ".scope\n", Identity{PodUID: uid, ContainerID: id}},
		"v2 systemd cri-o":      {"0::/kubepods.slice/kubepods-pod5f3b8a1e_2c4d_4e6f_8a0b_1c2d3e4f5a6b.slice/crio-" + id + ".scope\n", Identity{PodUID: uid, ContainerID: id}},
		"v2 cgroupfs":           {"0::/kubepods/besteffort/pod" + uid + "/" + id + "\n", Identity{PodUID: uid, ContainerID: id}},
		"v1 cgroupfs docker":    {"12:pids:/kubepods/burstable/pod" + uid + "/" + id + "\n11:memory:/kubepods/burstable/pod" + uid + "/" + id + "\n", Identity{PodUID: uid, ContainerID: id}},
		"v1 systemd docker":     {"9:name=systemd:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod5f3b8a1e_2c4d_4e6f_8a0b_1c2d3e4f5a6b.slice/docker-" + id + ".scope\n", Identity{PodUID: uid, ContainerID: id}},
		"pod sandbox only":      {"0::/kubepods/pod" + uid + "\n", Identity{PodUID: uid}},
		"not in a pod":          {"0::/user.slice/user-0.slice/session-1.scope\n", Identity{}},
		"docker outside k8s":    {"0::/system.slice/docker-" + id + ".scope\n", Identity{}},
		"empty":                 {"", Identity{}},
	} {
		if got := FromCgroupFile([]byte(tc.file)); got != tc.want {
			t.Errorf("%s: %+v, want %+v", name, got, tc.want)
		}
	}
}
