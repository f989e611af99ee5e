package tracer

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// TestObjectWithoutAMapIsRefused: an object lacking a program or a map the
// tracer uses is refused, by name, and nothing of it stays loaded.
func TestObjectWithoutAMapIsRefused(t *testing.T) {
	fields := reflect.TypeFor[objects]()
	for i := range fields.NumField() {
		missing := fields.Field(i).Tag.Get("ebpf")
		spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(_GpumemBytes))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkObject(spec); err != nil {
			t.Fatalf("the built-in object: %v", err)
		}
		delete(spec.Programs, missing)
		delete(spec.Maps, missing)
		if tr, err := load(spec, Options{}); err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("without %s: %v", missing, err)
			if tr != nil {
				tr.Close()
			}
		}
	}
}

// TestCloseClosesEveryObject: once the tracer is closed, no program or map
// it loaded is open.
func TestCloseClosesEveryObject(t *testing.T) {
	tr, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	tr.Close()
	fields := reflect.ValueOf(&tr.objs).Elem()
	for i := range fields.NumField() {
		if fd := fields.Field(i).Interface().(interface{ FD() int }).FD(); fd != -1 {
			t.Errorf("%s: still open (fd %d)", fields.Type().Field(i).Name, fd)
		}
	}
}
