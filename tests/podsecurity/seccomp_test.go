package podsecurity

import (
	"strings"
	"testing"
)

// TestRuntimeDefaultFilter: the compiled filter refuses what containerd's
// profile refuses to a container without CAP_SYS_ADMIN (unshare, AF_VSOCK
// sockets) and lets the rest through (AF_INET sockets, by an argument
// condition), where the same command without it does all.
func TestRuntimeDefaultFilter(t *testing.T) {
	script := `
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
try:
    socket.socket(40, socket.SOCK_STREAM)  # AF_VSOCK
    print("vsock allowed")
except OSError as e:
    print("vsock", e.strerror)
if libc.unshare(0x10000000) == 0:  # CLONE_NEWUSER
    print("unshare allowed")
else:
    print("unshare", os.strerror(ctypes.get_errno()))
`
	for profile, want := range map[string]string{
		"RuntimeDefault": "vsock Operation not permitted\nunshare Operation not permitted",
		"":               "unshare allowed",
	} {
		c := Context{Drop: []string{"ALL"}, Add: []string{"BPF", "PERFMON", "SYS_PTRACE"}, Seccomp: profile}
		cmd, err := c.Command("python3", "-c", script)
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), want) {
			t.Errorf("seccomp %q: %v\n%s\nwant %q", profile, err, out, want)
		}
	}
}
