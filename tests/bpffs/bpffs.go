// Package bpffs mounts BPF file systems of a test's own, where the agent's
// state is pinned (--pin-path) and no other test or run sees it.
package bpffs

import (
	"syscall"
	"testing"
)

// Mount mounts a BPF file system on a directory of t's, and unmounts it at
// the end of t, its pins with it.
func Mount(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		t.Fatalf("mount a BPF file system: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}
