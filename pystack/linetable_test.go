package pystack

import (
	"encoding/hex"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
)

// codeLines prints, for every code object compiled from a few standard
// library modules, its first line, line table and co_lines() ranges.
const codeLines = `
import json, sys, os
def walk(code):
    yield code
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            yield from walk(c)
out = []
for mod in ("json/decoder.py", "argparse.py", "asyncio/tasks.py"):
    path = os.path.join(os.path.dirname(os.__file__), mod)
    for code in walk(compile(open(path).read(), path, "exec")):
        out.append({"first": code.co_firstlineno, "table": code.co_linetable.hex(),
                    "lines": [[s, e, l or 0] for s, e, l in code.co_lines()]})
json.dump(out, sys.stdout)
`

// TestLineTablesMatchCPython decodes the line tables of thousands of code
// objects and compares every instruction's line with CPython's co_lines().
func TestLineTablesMatchCPython(t *testing.T) {
	for minor, prefix := range pyenvVersions {
		t.Run(minor, func(t *testing.T) {
			out, err := exec.Command(filepath.Join(prefix, "bin", "python"+minor), "-c", codeLines).Output()
			if err != nil {
				t.Fatal(err)
			}
			var codes []struct {
				First int
				Table string
				Lines [][3]int
			}
			if err := json.Unmarshal(out, &codes); err != nil {
				t.Fatal(err)
			}
			checked := 0
			for _, c := range codes {
				table, _ := hex.DecodeString(c.Table)
				for _, r := range c.Lines {
					for addr := r[0]; addr < r[1]; addr += 2 {
						var got int
						if minor == "3.10" {
							got = line310(table, c.First, addr)
						} else {
							got = line311(table, c.First, addr/2)
						}
						if got != r[2] {
							t.Fatalf("code at line %d, byte %d: line %d, CPython says %d", c.First, addr, got, r[2])
						}
						checked++
					}
				}
			}
			if len(codes) < 100 || checked < 10000 {
				t.Fatalf("only %d code objects, %d instructions", len(codes), checked)
			}
		})
	}
}
