// Package logs writes gpumem's log: in the text format a sentence a person
// reads per line, in the json format one JSON object per line for log
// pipelines, whose milestones carry an event name and their values as
// fields. A call site says its sentence once, and its event's fields once.
package logs

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"
)

// The events: the milestones a reader of the json format waits on, named
// here once. Their names and fields are an interface that log pipelines
// and tests rely on (docs/logs.md): add, never rename.
const (
	// Attached: probes on a library (library, kind: driver or allocator,
	// probes).
	Attached = "attached"
	// Python: a process's Python frames are walked (pid, version).
	Python = "python"
	// TensorView: a process's tensor view is on (pid, library, probes,
	// since).
	TensorView = "tensor_view"
	// NVML: the management library is read (driver, library).
	NVML = "nvml"
	// Waiting: no process maps the driver yet (scan_interval).
	Waiting = "waiting"
	// Recording: gpumem record records.
	Recording = "recording"
	// ServingMetrics: the agent's Prometheus endpoint listens (address).
	ServingMetrics = "serving_metrics"
	// ControlSocket: the agent's control socket listens (path).
	ControlSocket = "control_socket"
	// State: the state a previous agent left was continued (records,
	// waiting: bytes written while no agent ran) or refused (reason,
	// detail).
	State = "state"
)

// EventKey is the field naming a line's event.
const EventKey = "event"

// New is a logger writing to w in format: text (gpumem's sentences, as
// "gpumem: SENTENCE" lines) or json.
func New(w io.Writer, format string) (*slog.Logger, error) {
	switch format {
	case "text":
		return To(func(l Line) { fmt.Fprintf(w, "gpumem: %s\n", l.Msg) }), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, nil)), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}

// Line is one line of the log.
type Line struct {
	Msg    string         // the sentence
	Event  string         // the event's name; empty for a sentence of no event
	Fields map[string]any // the event's fields; nil for a sentence of no event
}

// To is a logger that hands each line to f: the text format, and loggers
// that take only a sentence (Inspektor Gadget's) or read events in the
// process (tests).
func To(f func(Line)) *slog.Logger { return slog.New(funcHandler(f)) }

type funcHandler func(Line)

func (funcHandler) Enabled(_ context.Context, level slog.Level) bool { return level >= slog.LevelInfo }

func (h funcHandler) Handle(_ context.Context, r slog.Record) error {
	l := Line{Msg: r.Message}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == EventKey {
			l.Event = a.Value.String()
			return true
		}
		if l.Fields == nil {
			l.Fields = map[string]any{}
		}
		l.Fields[a.Key] = a.Value.Any()
		return true
	})
	h(l)
	return nil
}

// WithAttrs and WithGroup keep nothing: gpumem's lines carry only their
// event's fields.
func (h funcHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h funcHandler) WithGroup(string) slog.Handler      { return h }

// Event logs msg, the sentence, as the event name with its fields
// (key-value pairs, as slog takes them).
func Event(l *slog.Logger, name, msg string, fields ...any) {
	l.Info(msg, append([]any{EventKey, name}, fields...)...)
}

// Printf logs a sentence of no event.
func Printf(l *slog.Logger, format string, args ...any) {
	l.Info(fmt.Sprintf(format, args...))
}

// Parse reads a line of the json format: its sentence, and its event's
// name and fields (numbers as json.Number, as written).
func Parse(text string) (Line, error) {
	var fields map[string]any
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	if err := d.Decode(&fields); err != nil {
		return Line{}, fmt.Errorf("log line %s: %w", text, err)
	}
	for _, key := range []string{slog.TimeKey, slog.LevelKey, slog.MessageKey} {
		if v, ok := fields[key].(string); !ok || v == "" {
			return Line{}, fmt.Errorf("log line %s: no %s", text, key)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, fields[slog.TimeKey].(string)); err != nil {
		return Line{}, fmt.Errorf("log line %s: %w", text, err)
	}
	l := Line{Msg: fields[slog.MessageKey].(string)}
	event, ok := fields[EventKey].(string)
	if !ok {
		return l, nil
	}
	for _, key := range []string{slog.TimeKey, slog.LevelKey, slog.MessageKey, EventKey} {
		delete(fields, key)
	}
	l.Event, l.Fields = event, fields
	return l, nil
}

// Is says whether l is the event name with fields holding wants (key-value
// pairs), values compared as printed: an int logged equals the number read
// back.
func (l Line) Is(name string, wants ...any) bool {
	if l.Event != name {
		return false
	}
	for i := 0; i+1 < len(wants); i += 2 {
		key, _ := wants[i].(string)
		if v, ok := l.Fields[key]; !ok || fmt.Sprint(v) != fmt.Sprint(wants[i+1]) {
			return false
		}
	}
	return true
}
