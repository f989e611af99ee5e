package container

import (
	"regexp"
	"strings"
	"testing"
)

var (
	uidForm = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	idForm  = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

func checkContainer(t *testing.T, c Identity) {
	t.Helper()
	if c.PodUID != "" && !uidForm.MatchString(c.PodUID) || c.ContainerID != "" && !idForm.MatchString(c.ContainerID) {
		t.Fatalf("%+v", c)
	}
	if c.ContainerID != "" && c.PodUID == "" {
		t.Fatalf("a container in no pod: %+v", c)
	}
}

// FuzzFromCgroupFile: any cgroup file gives a pod UID and container ID of
// their forms, or nothing; and cgroups a process makes under its
// container's cgroup (child) never change which pod and container it is.
func FuzzFromCgroupFile(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, child string) {
		c := FromCgroupFile(data)
		checkContainer(t, c)
		if c.ContainerID == "" || strings.ContainsAny(child, "\n") {
			return // the kernel refuses a cgroup name with a newline
		}
		lines := strings.Split(string(data), "\n")
		for i, l := range lines {
			if l != "" {
				lines[i] = strings.TrimSuffix(l, "/") + "/" + child
			}
		}
		if got := FromCgroupFile([]byte(strings.Join(lines, "\n"))); got != c {
			t.Fatalf("in a cgroup %q of its own: %+v, was %+v", child, got, c)
		}
	})
}
