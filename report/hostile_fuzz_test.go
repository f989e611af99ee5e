package report

// Every writer given names a traced process controls: its comm, and the
// function, file and module names of its frames (ELF symbols, Python code
// objects), which may hold markup, control characters, field and line
// separators and invalid UTF-8.

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/pprof/profile"
	"golang.org/x/net/html"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/pprof"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// fail fails the test, naming the writer.
func fail(t *testing.T, writer, format string, args ...any) {
	t.Helper()
	t.Fatalf(writer+": "+format, args...)
}

// names are what a process controls in one report.
type names struct {
	comm, fn1, fn2, file, module, pod string
}

// hostileReport is a report of two processes whose names are n's: rows of
// both views (every stack four frames), a failed allocation, an
// out-of-memory snapshot, a peak and a timeline.
func hostileReport(n names) *snapshot.Snapshot {
	a := []*symbolize.Frame{{Function: "cuMemAlloc_v2"}, {Function: n.fn1, File: n.file, Line: 3},
		{Function: n.fn2, Module: n.module, Address: 0x10}, {Module: n.module, Address: 0x20}}
	b := []*symbolize.Frame{{Function: "pytorch:malloc"}, {Function: n.fn2}, {Function: n.fn1, File: n.file, Line: 9}, {Module: n.module, Address: 0x30}}
	c := []*symbolize.Frame{{Function: "cuMemAlloc_v2"}, {Function: n.fn2}, {Function: n.fn1 + n.fn2}, {Function: "main", File: n.file, Line: 1}}
	pod := container.Identity{PodUID: "5f3b8a1e-2c4d-4e6f-8a0b-1c2d3e4f5a6b", Namespace: n.pod, Pod: n.pod, Name: n.pod, Workload: n.pod}
	row := func(pid uint32, comm string, stack accounting.StackID, kind memory.Kind, frames []*symbolize.Frame, alloc, free uint64) snapshot.Row {
		return snapshot.Row{Key: accounting.Key{PID: pid, Stack: stack, Kind: kind}, Comm: comm, Container: pod, Frames: frames,
			Counters: accounting.Counters{AllocBytes: alloc, AllocCount: 2, FreeBytes: free, FreeCount: 1}}
	}
	rows := []snapshot.Row{
		row(7, n.comm, 1, memory.KindDevice, a, 20*MiB, 0),
		row(7, n.comm, 2, memory.KindTensor, b, 16*MiB, 4*MiB),
		row(8, n.comm+n.pod, 3, memory.KindDevice, c, 8*MiB, 0),
	}
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	failure := snapshot.Failure{FailureKey: accounting.FailureKey{Key: rows[0].Key, Op: 1, Result: 2}, Comm: n.comm, Frames: a,
		Failures: accounting.Failures{Count: 1, Bytes: 80 << 30}}
	return snapshot.Snapshot{
		Time: at, Failures: []snapshot.Failure{failure},
		OOMs: []snapshot.OOM{{Time: at, Failure: failure, Held: rows[:1]}},
		Peaks: []snapshot.Peak{{PID: 7, Comm: n.comm, GPU: "0", Container: pod, View: memory.ViewDriver, Timestamp: 1000, Time: at,
			Amount: accounting.Amount{Bytes: 20 * MiB, Count: 2}, Rows: rows[:1]}},
		Timeline: &snapshot.Timeline{Start: at, Timestamp: 1000, Width: time.Millisecond, End: 2 * time.Millisecond,
			Series: []snapshot.TimelineSeries{{PID: 7, Comm: n.comm, GPU: "0", View: memory.ViewDriver, Buckets: []snapshot.TimelineBucket{
				{Max: 20 * MiB, MaxTime: time.Millisecond / 2, Top: []snapshot.Holder{{Kind: memory.KindDevice, Frames: a, Bytes: 20 * MiB}}}}}}},
		Libraries: []string{n.module},
	}.With(rows...)
}

// benign are names of the same shape as n, without anything hostile: what
// the writers' output is compared with.
func (n names) benign() names {
	return names{"python3", "load_weights", "forward", "train.py", "/usr/lib/libc10_cuda.so", "trainer-0"}
}

// inJSON is a name as JSON carries it: each byte of invalid UTF-8 as
// U+FFFD, as encoding/json writes it.
func inJSON(s string) string { return string([]rune(s)) }

// pageTokens are the page's elements and attributes, in order: text left
// out. Names must change none of them.
func pageTokens(page string) []string {
	var out []string
	z := html.NewTokenizer(strings.NewReader(page))
	for {
		switch z.Next() {
		case html.ErrorToken:
			return out
		case html.StartTagToken, html.EndTagToken, html.SelfClosingTagToken:
			tok := z.Token()
			s := tok.Type.String() + " " + tok.Data
			for _, a := range tok.Attr {
				s += " " + a.Key + "=" + a.Val
			}
			out = append(out, s)
		case html.CommentToken, html.DoctypeToken:
			out = append(out, z.Token().String())
		}
	}
}

// pageData is the JSON in the page's data script, as the browser reads it.
func pageJSON(page string) (string, bool) {
	z := html.NewTokenizer(strings.NewReader(page))
	inData := false
	for {
		switch z.Next() {
		case html.ErrorToken:
			return "", false
		case html.StartTagToken:
			tok := z.Token()
			inData = tok.Data == "script" && slices.Contains(tok.Attr, html.Attribute{Key: "id", Val: "profile"})
		case html.TextToken:
			if inData {
				return string(z.Text()), true
			}
		}
	}
}

func flameNames(n *flameNode, into map[string]bool) {
	if n == nil {
		return
	}
	into[n.Name] = true
	for _, c := range n.Children {
		flameNames(c, into)
	}
}

// FuzzHTML: the page has the elements and attributes of its template
// whatever the names (markup in a name is inert), its data is valid JSON
// and carries the names.
func FuzzHTML(f *testing.F) {
	template := pageTokens(strings.Replace(flameGraphPage, "/*DATA*/", "{}", 1))
	f.Fuzz(func(t *testing.T, comm, fn1, fn2, file, module, pod string) {
		n := names{comm, fn1, fn2, file, module, pod}
		var buf bytes.Buffer
		if err := WriteHTML(&buf, hostileReport(n)); err != nil {
			t.Fatal(err)
		}
		page := buf.String()
		if got := pageTokens(page); !slices.Equal(got, template) {
			fail(t, "html", "names changed the page's elements: %q", slices.DeleteFunc(got, func(s string) bool { return slices.Contains(template, s) }))
		}
		if _, err := html.Parse(strings.NewReader(page)); err != nil {
			fail(t, "html", "page does not parse: %v", err)
		}
		data, ok := pageJSON(page)
		if !ok || strings.ContainsAny(data, "<>&") {
			fail(t, "html", "data script: %v, markup characters in %.200q", ok, data)
		}
		var p flamePage
		if err := json.Unmarshal([]byte(data), &p); err != nil {
			fail(t, "html", "data: %v", err)
		}
		got := map[string]bool{}
		for _, tree := range p.Views {
			flameNames(tree, got)
		}
		for _, want := range []string{processName(comm, 7), fn2, "[gpu 0]"} {
			if want != "" && !got[inJSON(want)] {
				fail(t, "html", "%q not in the flame graph", want)
			}
		}
	})
}

var foldedLine = regexp.MustCompile(`^(.*) ([0-9]+)$`)

// FuzzFolded: every line is a stack of the process name, the GPU and the
// four frames, then its bytes; names add no frames and no lines.
func FuzzFolded(f *testing.F) {
	f.Fuzz(func(t *testing.T, comm, fn1, fn2, file, module, pod string) {
		n := names{comm, fn1, fn2, file, module, pod}
		for _, v := range []Value{InUse, Allocated, Peak} {
			for _, view := range memory.Views {
				var got, want bytes.Buffer
				if err := WriteFolded(&got, hostileReport(n), v, view); err != nil {
					continue // refused: clean
				}
				WriteFolded(&want, hostileReport(n.benign()), v, view)
				lines := strings.Split(strings.TrimSuffix(got.String(), "\n"), "\n")
				if got.Len() == 0 {
					lines = nil
				}
				if len(lines) > strings.Count(want.String(), "\n") {
					fail(t, "folded", "%s %s: %d lines, %d with plain names:\n%s", v, view, len(lines), strings.Count(want.String(), "\n"), got.String())
				}
				for _, l := range lines {
					m := foldedLine.FindStringSubmatch(l)
					if m == nil || strings.Count(m[1], ";") != 5 || strings.ContainsAny(l, "\r") {
						fail(t, "folded", "%s %s: line %q is not a stack of 6 names and bytes", v, view, l)
					}
				}
			}
		}
	})
}

// FuzzJSON: the report is valid JSON, and carries each name (invalid UTF-8
// as U+FFFD).
func FuzzJSON(f *testing.F) {
	f.Fuzz(func(t *testing.T, comm, fn1, fn2, file, module, pod string) {
		n := names{comm, fn1, fn2, file, module, pod}
		var buf bytes.Buffer
		if err := WriteJSON(&buf, hostileReport(n)); err != nil {
			t.Fatal(err)
		}
		if !json.Valid(buf.Bytes()) {
			fail(t, "json", "not valid JSON:\n%s", buf.String())
		}
		var out struct {
			Stacks []struct {
				Comm   string
				Pod    string
				Frames []struct{ Function, File, Module string }
			}
		}
		if err := json.Unmarshal(buf.Bytes(), &out); err != nil || len(out.Stacks) != 3 {
			fail(t, "json", "%v, %d stacks", err, len(out.Stacks))
		}
		s := out.Stacks[0]
		if s.Comm != inJSON(comm) || s.Pod != inJSON(pod) || s.Frames[1].File != inJSON(file) || s.Frames[2].Module != inJSON(module) ||
			fn1 != "" && s.Frames[1].Function != inJSON(fn1) {
			fail(t, "json", "names changed: %+v", s)
		}
	})
}

// controlFree says whether s holds no control character but line breaks
// (ESC and the others reach the reader's terminal).
func controlFree(s string) (rune, bool) {
	for _, r := range s {
		if r != '\n' && unicode.IsControl(r) {
			return r, false
		}
	}
	return 0, true
}

// FuzzTop: what top and the stacks listing print has as many lines as
// with plain names, and no control character from a name.
func FuzzTop(f *testing.F) {
	f.Fuzz(func(t *testing.T, comm, fn1, fn2, file, module, pod string) {
		n := names{comm, fn1, fn2, file, module, pod}
		for _, w := range []struct {
			name  string
			write func(*bytes.Buffer, *snapshot.Snapshot) error
		}{
			{"top", func(b *bytes.Buffer, r *snapshot.Snapshot) error {
				return WriteTop(b, r, 0, nil)
			}},
			{"stacks", func(b *bytes.Buffer, r *snapshot.Snapshot) error { return WriteStacks(b, r, 5) }},
			{"oom", func(b *bytes.Buffer, r *snapshot.Snapshot) error {
				_, err := b.WriteString(DescribeOOM(r.OOMs[0]) + "\n")
				return err
			}},
			{"peak", func(b *bytes.Buffer, r *snapshot.Snapshot) error {
				_, err := b.WriteString(DescribePeak(r.Peaks[0], 0) + "\n")
				return err
			}},
		} {
			var got, want bytes.Buffer
			if err := w.write(&got, hostileReport(n)); err != nil {
				t.Fatal(err)
			}
			w.write(&want, hostileReport(n.benign()))
			if g, wl := strings.Count(got.String(), "\n"), strings.Count(want.String(), "\n"); g != wl {
				fail(t, "top", "%s: %d lines, %d with plain names:\n%s", w.name, g, wl, got.String())
			}
			if r, ok := controlFree(got.String()); !ok {
				fail(t, "top", "%s: control character %U printed:\n%q", w.name, r, got.String())
			}
			if !utf8.Valid(got.Bytes()) {
				fail(t, "top", "%s: invalid UTF-8 printed:\n%q", w.name, got.String())
			}
		}
	})
}

// FuzzPprof: the profile is valid, parses back with
// github.com/google/pprof/profile, and carries each name as it was, but
// for invalid UTF-8, which becomes U+FFFD (a protobuf string is UTF-8).
func FuzzPprof(f *testing.F) {
	f.Fuzz(func(t *testing.T, comm, fn1, fn2, file, module, pod string) {
		n := names{comm, fn1, fn2, file, module, pod}
		var buf bytes.Buffer
		if err := pprof.Write(&buf, hostileReport(n), pprof.Comment(hostileReport(n))...); err != nil {
			fail(t, "pprof", "write: %v", err)
		}
		back, err := profile.Parse(&buf)
		if err != nil {
			fail(t, "pprof", "parse: %v", err)
		}
		if err := back.CheckValid(); err != nil {
			fail(t, "pprof", "invalid: %v", err)
		}
		functions := map[string]bool{}
		for _, fn := range back.Function {
			functions[fn.Name] = true
		}
		comms := map[string]bool{}
		for _, s := range back.Sample {
			comms[strings.Join(s.Label["comm"], "")] = true // a label of "" is not written: no comm
		}
		valid := func(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
		if fn1 != "" && !functions[valid(fn1)] || fn2 != "" && !functions[valid(fn2)] || !comms[valid(comm)] {
			fail(t, "pprof", "names changed: functions %q, comms %q", functions, comms)
		}
	})
}
