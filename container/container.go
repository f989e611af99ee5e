// Package container tells which Kubernetes pod and container a process
// runs in, from what its cgroup says: pod UID and container ID (cgroup v1
// and v2, systemd and cgroupfs drivers, containerd, CRI-O and Docker
// naming). The names come from the API server (package
// operators/k8smeta, a Namer).
package container

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Identity is where a process runs; empty outside Kubernetes pods. The
// cgroup gives the UID and ID; the API server, when there is one, the names.
type Identity struct {
	PodUID      string // "5f3b8a1e-..." (dashes, as the API server has it)
	ContainerID string // 64 hex digits
	Namespace   string
	Pod         string
	Name        string // the container's
	Workload    string // see Pod.Workload
}

// Namer fills in the names of an Identity (the API server's).
type Namer interface {
	Name(Identity) Identity
}

var (
	// kubelet puts pods under pod<UID>: dashes with the cgroupfs driver,
	// underscores inside systemd slice names.
	podUID = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)
	// A container's cgroup is its 64-digit ID, bare (cgroupfs) or in a
	// runtime's systemd scope: cri-containerd-ID.scope, crio-ID.scope,
	// docker-ID.scope.
	containerID = regexp.MustCompile(`^(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?$`)
)

// FromCgroupFile reads the contents of /proc/PID/cgroup: the first line
// naming a pod gives the pod UID, and the path element under the pod's the
// container.
func FromCgroupFile(data []byte) Identity {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if c := fromPath(parts[2]); c.PodUID != "" {
			return c
		}
	}
	return Identity{}
}

// fromPath reads a cgroup path: the first element naming a pod, the one
// kubelet made, and the container's cgroup right under it. A process that
// may create cgroups under its own (a container given cgroup delegation)
// can name them as it likes: what it makes below its container's cgroup
// must not pass it off as another pod or container.
func fromPath(path string) Identity {
	elems := strings.Split(path, "/")
	for i, elem := range elems {
		m := podUID.FindStringSubmatch(elem)
		if m == nil {
			continue
		}
		c := Identity{PodUID: strings.ReplaceAll(m[1], "_", "-")}
		if i+1 < len(elems) {
			if m := containerID.FindStringSubmatch(elems[i+1]); m != nil {
				c.ContainerID = m[1]
			}
		}
		return c
	}
	return Identity{}
}

// OfProcess reads a process's cgroup; empty when it cannot be read or the
// process is in no pod.
func OfProcess(procRoot string, pid int) Identity {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return Identity{}
	}
	return FromCgroupFile(data)
}
