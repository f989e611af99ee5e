package discover

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// DriverDirs are where NVIDIA's driver installs libcuda.so: the
// distributions' library directories, the container toolkit's and the GPU
// operator's (/run/nvidia/driver is its driver container's root), and
// CUDA's forward-compatibility package. The directories that
// /etc/ld.so.conf.d names are searched too.
var DriverDirs = []string{
	"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
	"/lib/x86_64-linux-gnu", "/lib64",
	"/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/local/cuda/compat",
	"/run/nvidia/driver/usr/lib/x86_64-linux-gnu", "/run/nvidia/driver/usr/lib64",
}

// Installed finds the driver libraries installed in dirs under each root
// (a file system seen from here: "/", or the host's through
// /proc/1/root), once per file. Attaching to them before any process
// loads them traces a program from its first driver call, where a scan
// of running processes finds it only after it started. Unreadable
// directories are skipped.
func Installed(roots, dirs []string) []Library {
	seen := map[string]bool{}
	var libs []Library
	for _, root := range roots {
		for _, dir := range slices.Concat(dirs, ldConfigDirs(root)) {
			matches, _ := filepath.Glob(filepath.Join(root, dir, "libcuda.so*"))
			for _, path := range matches {
				lib, err := installedLibrary(path)
				if err != nil || seen[lib.ID()] {
					continue
				}
				seen[lib.ID()] = true
				libs = append(libs, lib)
			}
		}
	}
	return libs
}

// installedLibrary identifies the file at path (following links) as
// /proc/PID/maps would show it mapped.
func installedLibrary(path string) (Library, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Library{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return Library{}, fmt.Errorf("%s: not a regular file", path)
	}
	dev := fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev))
	return Library{Dev: dev, Inode: st.Ino, Path: path}, nil
}

// ldConfigDirs are the directories /etc/ld.so.conf.d/*.conf under root
// name, as relative to root.
func ldConfigDirs(root string) []string {
	confs, _ := filepath.Glob(filepath.Join(root, "etc/ld.so.conf.d/*.conf"))
	var dirs []string
	for _, conf := range confs {
		f, err := os.Open(conf)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "/") {
				dirs = append(dirs, line)
			}
		}
		f.Close()
	}
	return dirs
}
