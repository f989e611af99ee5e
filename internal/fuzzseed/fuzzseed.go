// Package fuzzseed writes the seed corpora of the fuzz targets: files in
// Go's corpus format (testdata/fuzz/FuzzX/NAME) that plain `go test` runs as
// cases and `go test -fuzz` starts from. Seeds come from real inputs (an ELF
// file built by cc, /proc lines, torch's USDT operands, an API server's
// pods). The corpora are committed; each package's generator, TestWriteSeeds
// in its seeds_test.go, is built only with the fuzzseed tag and run by go
// generate (make fuzz-seeds):
//
//	go generate -tags fuzzseed -run fuzzseed ./...
//
// so that go test runs the corpora and writes nothing.
package fuzzseed

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Seed is one corpus file: its name and the fuzz target's arguments.
type Seed struct {
	Name string
	Args []any
}

// Of is the seed name with args.
func Of(name string, args ...any) Seed { return Seed{Name: name, Args: args} }

// Encode is a seed in Go's corpus format ("go test fuzz v1"), for the
// argument types the targets take.
func Encode(args ...any) []byte {
	var b bytes.Buffer
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", v)
		case string:
			fmt.Fprintf(&b, "string(%q)\n", v)
		case int, int64, uint, uint16, uint32, uint64, bool:
			fmt.Fprintf(&b, "%T(%v)\n", v, v)
		case uint8:
			fmt.Fprintf(&b, "byte(%q)\n", v)
		default:
			panic(fmt.Sprintf("fuzzseed: no encoding for %T", a))
		}
	}
	return b.Bytes()
}

// Write writes the seeds of target under testdata/fuzz/target, in the
// package the generator runs in. Files it does not name (crashers the
// fuzzer found, kept as regressions) are left alone.
func Write(t testing.TB, target string, seeds []Seed) {
	t.Helper()
	dir := filepath.Join("testdata", "fuzz", target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range seeds {
		if err := os.WriteFile(filepath.Join(dir, s.Name), Encode(s.Args...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Recording says whether the seeds recorded on this machine are written
// again: those read from a live process (its memory, its maps) differ from
// one run to the next (addresses) and one machine to the next (paths,
// inodes), so they are written only with GPUMEM_RECORD_SEEDS=1 (make
// fuzz-seeds RECORD=1) and otherwise left as committed.
func Recording(t testing.TB, what string) bool {
	t.Helper()
	if os.Getenv("GPUMEM_RECORD_SEEDS") == "1" {
		return true
	}
	t.Logf("%s: recorded from a live process, left as committed (GPUMEM_RECORD_SEEDS=1 records them again)", what)
	return false
}
