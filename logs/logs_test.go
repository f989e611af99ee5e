package logs

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// logEach logs, in format, a sentence of no event and an event.
func logEach(t *testing.T, format string) string {
	t.Helper()
	var b bytes.Buffer
	l, err := New(&b, format)
	if err != nil {
		t.Fatal(err)
	}
	Printf(l, "waiting for %s", "you")
	Event(l, Python, "pid 7: Python 3.12 frames", "pid", 7, "version", "3.12")
	return b.String()
}

func TestTextSaysTheSentences(t *testing.T) {
	if got, want := logEach(t, "text"), "gpumem: waiting for you\ngpumem: pid 7: Python 3.12 frames\n"; got != want {
		t.Errorf("text log %q, want %q", got, want)
	}
}

func TestJSONCarriesTheEvents(t *testing.T) {
	lines := strings.Split(strings.TrimSuffix(logEach(t, "json"), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("json log %q, want 2 lines", lines)
	}
	var got []string
	for _, text := range lines {
		l, err := Parse(text)
		if err != nil {
			t.Fatal(err)
		}
		fields, err := json.Marshal(l.Fields)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, l.Msg+" | "+l.Event+" "+string(fields))
	}
	// The pid a JSON number, the version a string.
	want := []string{"waiting for you |  null", `pid 7: Python 3.12 frames | python {"pid":7,"version":"3.12"}`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("read back %q, want %q", got, want)
	}
	l, _ := Parse(lines[1])
	if !l.Is(Python, "pid", 7) || !l.Is(Python, "pid", 7, "version", "3.12") || l.Is(Python, "pid", 8) || l.Is(Attached) || l.Is(Python, "library", "") {
		t.Errorf("%+v: Is answers otherwise", l)
	}
}

func TestNewRefusesOtherFormats(t *testing.T) {
	if _, err := New(&bytes.Buffer{}, "yaml"); err == nil || err.Error() != `log format "yaml": want text or json` {
		t.Errorf("New(yaml): %v", err)
	}
}
