// Package cgrouptest puts test processes in cgroups named the way kubelet
// (systemd driver) and containerd name a container's, for tests.
package cgrouptest

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// root is where the cgroup v2 hierarchy is mounted.
func root(t testing.TB) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, field := range fields {
			if field == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" {
				return fields[4]
			}
		}
	}
	t.Fatal("no cgroup v2 hierarchy mounted")
	return ""
}

// InContainer moves pid into the cgroup of container containerID of pod
// podUID, and back to the root cgroup when the test ends.
func InContainer(t testing.TB, pid int, podUID, containerID string) {
	t.Helper()
	top := root(t)
	dir := top
	var made []string
	for _, s := range []string{"kubepods.slice", "kubepods-burstable.slice",
		"kubepods-burstable-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice",
		"cri-containerd-" + containerID + ".scope"} {
		dir = filepath.Join(dir, s)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
		made = append(made, dir)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.WriteFile(filepath.Join(top, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
		for i := len(made) - 1; i >= 0; i-- {
			os.Remove(made[i])
		}
	})
}
