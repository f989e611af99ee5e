// Package fuzzseed writes the seed corpora of the fuzz targets: files in
// Go's corpus format (testdata/fuzz/FuzzX/NAME) that plain `go test` runs as
// cases and `go test -fuzz` starts from. Seeds come from real inputs (an ELF
// file built by a test, /proc lines, torch's USDT operands, an API server's
// pods); a package's seed test writes them when GPUMEM_WRITE_SEEDS=1.
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
// package the test runs in, when GPUMEM_WRITE_SEEDS=1, and skips the test
// otherwise: the committed files are the corpus, and a seed built from a
// compiled file differs from one compiler to the next. Files the fuzzer
// added (crashers kept as regressions) are left alone.
func Write(t *testing.T, target string, seeds []Seed) {
	t.Helper()
	if os.Getenv("GPUMEM_WRITE_SEEDS") != "1" {
		t.Skip("GPUMEM_WRITE_SEEDS=1 writes the seed corpora")
	}
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
