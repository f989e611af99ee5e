package tracer

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// TestObjectWithoutAMapIsRefused: an object lacking a program or a map the
// tracer uses is refused by name, before anything is loaded.
func TestObjectWithoutAMapIsRefused(t *testing.T) {
	for _, missing := range append(append([]string{}, programs...), maps...) {
		spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(_GpumemBytes))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkObject(spec); err != nil {
			t.Fatalf("the built-in object: %v", err)
		}
		delete(spec.Programs, missing)
		delete(spec.Maps, missing)
		if err := checkObject(spec); err == nil || !strings.HasSuffix(err.Error(), " "+missing) {
			t.Errorf("without %s: %v", missing, err)
		}
	}
}
