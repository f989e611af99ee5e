package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// checkOutput says, before anything is recorded, whether a report can be
// written at path (- is stdout): its folder exists and takes a new file,
// or the file exists and can be written. Nothing is left behind.
func checkOutput(path string) error {
	if path == "-" {
		return nil
	}
	if info, err := os.Stat(path); err == nil {
		if info.IsDir() {
			return fmt.Errorf("-o %s: a folder, not a file", path)
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0) // not truncated: the old report stays until the new one is written
		if err != nil {
			return fmt.Errorf("-o %s: cannot write it: %w", path, cause(err))
		}
		return f.Close()
	}
	return checkFolder("-o "+path, filepath.Dir(path))
}

// checkFolder says whether dir exists and takes a new file; flag names
// what asks for it in the error (-o FILE, --on-oom DIR). Nothing is left
// behind.
func checkFolder(flag, dir string) error {
	info, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s: folder %s does not exist", flag, dir)
	case err != nil:
		return fmt.Errorf("%s: folder %s: %w", flag, dir, cause(err))
	case !info.IsDir():
		return fmt.Errorf("%s: %s is not a folder", flag, dir)
	}
	probe, err := os.CreateTemp(dir, ".gpumem-check-*")
	if err != nil {
		return fmt.Errorf("%s: cannot write in folder %s: %w", flag, dir, cause(err))
	}
	probe.Close()
	return os.Remove(probe.Name())
}

// writeReport writes a report with write to path (- is stdout). If path
// cannot be written now (its folder removed or its file system full during
// the recording), the report is kept in the temporary folder, or else in
// the current one, as gpumem-PID-TIME.EXT (ext: .pb.gz, .json, ...), and
// the error says where. It returns where the report is.
func writeReport(path, ext string, write func(io.Writer) error) (string, error) {
	if path == "-" {
		if err := write(os.Stdout); err != nil {
			return "", fmt.Errorf("write to stdout: %w", err)
		}
		return path, nil
	}
	err := writeFileAt(path, write)
	if err == nil {
		return path, nil
	}
	name := fmt.Sprintf("gpumem-%d-%s%s", os.Getpid(), time.Now().Format("20060102T150405"), ext)
	var lost []string
	for _, dir := range []string{os.TempDir(), "."} {
		kept := filepath.Join(dir, name)
		if keptErr := writeFileAt(kept, write); keptErr != nil {
			lost = append(lost, keptErr.Error())
			continue
		}
		if abs, absErr := filepath.Abs(kept); absErr == nil {
			kept = abs
		}
		return kept, fmt.Errorf("%w; the report is kept in %s", err, kept)
	}
	return "", fmt.Errorf("%w; the report is lost: %s", err, strings.Join(lost, "; "))
}

// writeFileAt creates path and writes it; a regular file written in part
// is removed, so that no truncated report is taken for a whole one (a
// device, such as /dev/full, is left alone).
func writeFileAt(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, cause(err))
	}
	err = write(f)
	info, statErr := f.Stat()
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		if statErr == nil && info.Mode().IsRegular() {
			os.Remove(path)
		}
		return fmt.Errorf("write %s: %w", path, cause(err))
	}
	return nil
}

// cause is what a path error says beyond the path, which the callers name.
func cause(err error) error {
	var pathErr *fs.PathError
	if errors.As(err, &pathErr) {
		return pathErr.Err
	}
	return err
}
