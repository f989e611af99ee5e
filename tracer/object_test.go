package tracer

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// TestObjectWithoutAMapIsRefused: an object lacking a program or a map the
// tracer uses, or a map or variable it sizes or sets at load, is refused,
// by name, and nothing of it stays loaded. Each name is one bpf2go gives:
// the built-in object has them all.
func TestObjectWithoutAMapIsRefused(t *testing.T) {
	var names []string
	for _, fields := range []reflect.Type{reflect.TypeFor[objects](), reflect.TypeFor[sized]()} {
		for i := range fields.NumField() {
			names = append(names, fields.Field(i).Tag.Get("ebpf"))
		}
	}
	for _, missing := range names {
		spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(_GpumemBytes))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkObject(spec); err != nil {
			t.Fatalf("the built-in object: %v", err)
		}
		if spec.Programs[missing] == nil && spec.Maps[missing] == nil && spec.Variables[missing] == nil {
			t.Fatalf("the built-in object has no %s", missing)
		}
		delete(spec.Programs, missing)
		delete(spec.Maps, missing)
		delete(spec.Variables, missing)
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
