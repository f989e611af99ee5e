// Package breakdown sorts what a snapshot holds into categories (weights,
// gradients, optimizer state, KV cache, activations, CUDA graph pools,
// the allocator's cache, libraries' workspaces, NVML's parts), measures
// the fragmentation of PyTorch's allocator, and says why an out-of-memory
// happened. It is a reading of a snapshot, never on the event path: the
// rules that sort stacks are data (default.rules, and a user's file).
package breakdown

import (
	"bufio"
	_ "embed"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

//go:embed default.rules
var defaultRules string

// Rules sort stacks into categories; the zero value has none. A user's
// rules come before the shipped ones.
type Rules struct {
	rules []rule
}

type rule struct {
	category string
	library  string // library_workspaces' library
	conds    []cond
	where    string // file:line, for errors and tests
}

type cond struct {
	field   string // one of conditionFields
	pattern string
}

// conditionFields are what a condition reads of a frame: its function, its
// file (Python's), its library (native), its thread (memory.ThreadOf).
var conditionFields = []string{"function", "file", "library", "thread"}

// tensorCategories are what a rule may name for a tensor.
var tensorCategories = map[string]bool{
	snapshot.Parameters: true, snapshot.Gradients: true, snapshot.OptimizerState: true,
	snapshot.KVCache: true, snapshot.Activations: true,
}

// Default are the rules shipped for PyTorch, transformers and vLLM.
// They are parsed once: the agent sorts with them every interval.
func Default() *Rules { return parsedDefault() }

var parsedDefault = sync.OnceValue(func() *Rules {
	r, err := Parse(strings.NewReader(defaultRules), "default.rules")
	if err != nil {
		panic(err) // TestDefaultRulesParse keeps it from happening
	}
	return r
})

// Load reads a user's rules from path and puts them before the shipped
// ones.
func Load(path string) (*Rules, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("breakdown rules: %w", err)
	}
	defer f.Close()
	user, err := Parse(f, path)
	if err != nil {
		return nil, err
	}
	return &Rules{rules: append(user.rules, Default().rules...)}, nil
}

// Parse reads rules, one a line; name says where they come from in errors.
func Parse(r io.Reader, name string) (*Rules, error) {
	var rules Rules
	scan := bufio.NewScanner(r)
	for n := 1; scan.Scan(); n++ {
		line := strings.TrimSpace(scan.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		where := fmt.Sprintf("%s:%d", name, n)
		ru, err := parseRule(line)
		if err != nil {
			return nil, fmt.Errorf("breakdown rules: %s: %w", where, err)
		}
		ru.where = where
		rules.rules = append(rules.rules, ru)
	}
	if err := scan.Err(); err != nil {
		return nil, fmt.Errorf("breakdown rules: %s: %w", name, err)
	}
	return &rules, nil
}

func parseRule(line string) (rule, error) {
	fields := strings.Fields(line)
	category, library, _ := strings.Cut(fields[0], "/")
	ru := rule{category: category, library: library}
	switch {
	case tensorCategories[category] || category == snapshot.OtherDriver:
		if library != "" {
			return rule{}, fmt.Errorf("%s takes no library: %q", category, fields[0])
		}
	case category == snapshot.LibraryWorkspaces:
		if library == "" {
			return rule{}, fmt.Errorf("%s needs a library after a slash: %s/cublas", category, category)
		}
	default:
		return rule{}, fmt.Errorf("unknown category %q: want parameters, gradients, optimizer_state, kv_cache, activations, library_workspaces/<library> or other_driver", category)
	}
	if len(fields) == 1 {
		return rule{}, fmt.Errorf("%s: no condition: want function=, file=, library= or thread=<pattern>", category)
	}
	for _, f := range fields[1:] {
		field, pattern, ok := strings.Cut(f, "=")
		if !ok || pattern == "" || !slices.Contains(conditionFields, field) {
			return rule{}, fmt.Errorf("condition %q: want function=, file=, library= or thread=<pattern>", f)
		}
		ru.conds = append(ru.conds, cond{field, pattern})
	}
	return ru, nil
}

// forTensors says whether the rule sorts tensors (else driver memory).
func (r *rule) forTensors() bool { return tensorCategories[r.category] }

// claims says whether every condition holds for frame f.
func (r *rule) claims(f *symbolize.Frame) bool {
	for _, c := range r.conds {
		var value string
		switch c.field {
		case "function":
			value = f.Function
		case "file":
			value = f.File
		case "library":
			if f.Module != "" {
				value = filepath.Base(f.Module)
			}
		case "thread":
			value, _ = memory.ThreadOf(f.Function)
		}
		if value == "" || !match(c.pattern, value) {
			return false
		}
	}
	return true
}

// match says whether s is pattern whole, * matching any run of
// characters (slashes and dots too).
func match(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return s == pattern
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, last)
}

// claimOf is the first rule claiming frame f, for tensors or driver
// memory; nil if none.
func (rs *Rules) claimOf(f *symbolize.Frame, tensors bool) *rule {
	for i := range rs.rules {
		if r := &rs.rules[i]; r.forTensors() == tensors && r.claims(f) {
			return r
		}
	}
	return nil
}
