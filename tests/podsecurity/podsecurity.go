// Package podsecurity runs a command on this machine as a container's
// securityContext in the chart's DaemonSet would have it run, for tests:
// root with the chart's added capabilities only (bounding, permitted and
// effective sets; inheritable and ambient empty, as container runtimes set
// them), no_new_privs (allowPrivilegeEscalation: false), a read-only root
// file system (readOnlyRootFilesystem: true), in a mount namespace of its
// own, and, for seccompProfile RuntimeDefault, the seccomp filter
// containerd makes for those capabilities.
package podsecurity

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpu-mem/gpu-mem/tests/chartrender"
)

// Context is a container's securityContext, as far as these tests model it.
type Context struct {
	Privileged               bool
	ReadOnlyRootFilesystem   bool
	AllowPrivilegeEscalation bool
	Seccomp                  string   // seccompProfile.type
	Drop, Add                []string // capabilities, as Kubernetes names them (BPF, SYS_PTRACE)
	Volumes                  []string // writable mounts in a read-only root (WithVolumes)
}

// FromChart reads the securityContext of the DaemonSet's container in the
// chart under root, rendered with its default values.
func FromChart(root string) (Context, error) {
	objects, err := chartrender.Render(root, "gpu", nil)
	if err != nil {
		return Context{}, fmt.Errorf("render the chart: %w", err)
	}
	for _, obj := range objects {
		if obj["kind"] != "DaemonSet" {
			continue
		}
		containers, _ := dig(obj, "spec", "template", "spec", "containers").([]any)
		if len(containers) != 1 {
			return Context{}, fmt.Errorf("DaemonSet has %d containers, want 1", len(containers))
		}
		sc := dig(containers[0], "securityContext")
		c := Context{
			Privileged:               dig(sc, "privileged") == true,
			ReadOnlyRootFilesystem:   dig(sc, "readOnlyRootFilesystem") == true,
			AllowPrivilegeEscalation: dig(sc, "allowPrivilegeEscalation") != false, // Kubernetes' default: allowed
		}
		c.Seccomp, _ = dig(sc, "seccompProfile", "type").(string)
		for _, list := range []struct {
			key string
			to  *[]string
		}{{"drop", &c.Drop}, {"add", &c.Add}} {
			names, _ := dig(sc, "capabilities", list.key).([]any)
			for _, n := range names {
				*list.to = append(*list.to, fmt.Sprint(n))
			}
		}
		return c, nil
	}
	return Context{}, fmt.Errorf("the chart renders no DaemonSet")
}

func dig(obj any, path ...string) any {
	for _, k := range path {
		m, _ := obj.(map[string]any)
		obj = m[k]
	}
	return obj
}

// Capability numbers by Kubernetes' names, for those the agent uses or
// might be given.
var numbers = map[string]int{
	"SYS_PTRACE": unix.CAP_SYS_PTRACE, "SYS_ADMIN": unix.CAP_SYS_ADMIN, "SYS_RESOURCE": unix.CAP_SYS_RESOURCE,
	"PERFMON": unix.CAP_PERFMON, "BPF": unix.CAP_BPF, "CHECKPOINT_RESTORE": unix.CAP_CHECKPOINT_RESTORE,
	"DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE, "DAC_READ_SEARCH": unix.CAP_DAC_READ_SEARCH, "IPC_LOCK": unix.CAP_IPC_LOCK,
	"SYSLOG": unix.CAP_SYSLOG, "NET_ADMIN": unix.CAP_NET_ADMIN,
}

// Mask is the capability set of names, as /proc/PID/status shows sets.
func Mask(names []string) (uint64, error) {
	var mask uint64
	for _, n := range names {
		bit, ok := numbers[n]
		if !ok {
			return 0, fmt.Errorf("capability %s: unknown to these tests", n)
		}
		mask |= 1 << bit
	}
	return mask, nil
}

// WithVolumes is c with paths mounted writable into the read-only root
// file system, as a pod's hostPath volumes are.
func (c Context) WithVolumes(paths ...string) Context {
	c.Volumes = append(slices.Clone(c.Volumes), paths...)
	return c
}

// Without is c less capability name.
func (c Context) Without(name string) Context {
	c.Add = slices.DeleteFunc(slices.Clone(c.Add), func(n string) bool { return n == name })
	return c
}

// Command is name run with args under c. Only what the chart asks for is
// modelled: drop ALL, the added capabilities, no privilege escalation, a
// read-only root file system, RuntimeDefault seccomp; privileged is
// refused.
func (c Context) Command(name string, args ...string) (*exec.Cmd, error) {
	if c.Privileged || !slices.Contains(c.Drop, "ALL") {
		return nil, fmt.Errorf("securityContext %+v: not privileged and drop ALL are modelled only", c)
	}
	var env []string
	switch c.Seccomp {
	case "", "Unconfined":
	case "RuntimeDefault":
		// This test binary, run again, installs the filter and runs the
		// command (init, in seccomp.go): the last step before it, after
		// the capabilities are dropped, as runc does.
		filter, err := compile(RuntimeDefault(c.Add))
		if err != nil {
			return nil, fmt.Errorf("seccomp RuntimeDefault: %w", err)
		}
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		env = []string{filterEnv + "=" + encodeFilter(filter)}
		args = append([]string{name}, args...)
		name = self
	default:
		return nil, fmt.Errorf("seccompProfile %s: not modelled", c.Seccomp)
	}
	caps := "-all"
	for _, n := range c.Add {
		if _, ok := numbers[n]; !ok {
			return nil, fmt.Errorf("capability %s: unknown to these tests", n)
		}
		caps += ",+" + strings.ToLower(n)
	}
	// As root, exec makes the permitted and effective sets the bounding
	// set; inheritable and ambient stay empty, as runc leaves them.
	argv := []string{"setpriv", "--bounding-set", caps, "--inh-caps", "-all", "--ambient-caps", "-all"}
	if !c.AllowPrivilegeEscalation {
		argv = append(argv, "--no-new-privs")
	}
	argv = append(argv, name)
	argv = append(argv, args...)
	if c.ReadOnlyRootFilesystem {
		// A mount namespace of the command's own, where / and /sys are
		// read-only (a container's sysfs is, unprivileged); the mounts are
		// made before the capabilities are dropped.
		script := `mount -o remount,bind,ro / && mount -o remount,bind,ro /sys && exec "$@"`
		for _, v := range c.Volumes { // mounts of their own: the root's remount leaves them writable
			script = fmt.Sprintf("mount --bind '%s' '%s' && ", v, v) + script
		}
		argv = append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	return cmd, nil
}

// Status is the fields of /proc/PID/status by name.
func Status(pid int) (map[string]string, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fields := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		fields[k] = strings.TrimSpace(v)
	}
	return fields, sc.Err()
}

// Set is a capability set of a status (CapEff, CapBnd, ...).
func Set(status map[string]string, name string) (uint64, error) {
	v, ok := status[name]
	if !ok {
		return 0, fmt.Errorf("no %s in status", name)
	}
	return strconv.ParseUint(v, 16, 64)
}
