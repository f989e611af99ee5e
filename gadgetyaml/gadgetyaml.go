// Package gadgetyaml checks a gadget's gadget.yaml strictly: IG reads it
// leniently (an unknown key or a misspelt annotation is silently ignored,
// and a bad value shows up only as odd output on a cluster), so the image
// build refuses what IG would let through.
package gadgetyaml

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"gopkg.in/yaml.v3"

	"github.com/inspektor-gadget/inspektor-gadget/pkg/gadgets/run/types"
	metadatav1 "github.com/inspektor-gadget/inspektor-gadget/pkg/metadata/v1"
)

// Metadata is gadget.yaml: IG's gadget metadata, plus the per-program
// settings IG's eBPF operator reads from the same file.
type Metadata struct {
	metadatav1.GadgetMetadata `yaml:",inline"`
	Programs                  map[string]Program `yaml:"programs,omitempty"`
}

// Program overrides where IG's eBPF operator attaches a program;
// "gadget_program_disabled" leaves it unattached.
type Program struct {
	AttachTo string `yaml:"attach_to"`
}

// Read decodes gadget.yaml, refusing keys IG does not know.
func Read(path string) (*Metadata, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var m Metadata
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &m, nil
}

// Check validates m on its own and, when spec is not nil, against the
// compiled object it describes. It reports every problem, not the first.
func Check(m *Metadata, spec *ebpf.CollectionSpec) error {
	var errs []error
	if m.Name == "" {
		errs = append(errs, errors.New("name is empty"))
	}
	for _, ds := range sortedKeys(m.DataSources) {
		errs = append(errs, checkDataSource(ds, m.DataSources[ds])...)
	}
	if spec != nil {
		errs = append(errs, checkAgainstObject(m, spec)...)
	}
	return errors.Join(errs...)
}

func checkDataSource(name string, ds *metadatav1.DataSource) []error {
	where := "data source " + name
	if ds == nil {
		return []error{fmt.Errorf("%s: empty", where)}
	}
	errs := checkAnnotations(where, ds.Annotations)
	for _, f := range sortedKeys(ds.Fields) {
		errs = append(errs, checkAnnotations(where+", field "+f, ds.Fields[f].Annotations)...)
	}
	if f, ok := ds.Annotations["profiles.value-field"]; ok {
		if _, declared := ds.Fields[f]; !declared {
			errs = append(errs, fmt.Errorf("%s: profiles.value-field names field %q, which it does not declare", where, f))
		}
	}
	if ds.Annotations["metrics.collect"] != "true" {
		for _, f := range sortedKeys(ds.Fields) {
			if _, ok := ds.Fields[f].Annotations["metrics.type"]; ok {
				errs = append(errs, fmt.Errorf("%s, field %s: metrics.type without metrics.collect on the data source", where, f))
			}
		}
	}
	return errs
}

// kinds of annotation values.
const (
	text = iota
	boolean
	count
)

// annotations IG's operators read, with the values they accept: a kind, or
// the list of allowed values.
var annotations = map[string]any{
	"description": text, "template": text,
	"columns.width": count, "columns.maxwidth": count, "columns.minwidth": count, "columns.precision": count,
	"columns.alignment": []string{"left", "right"},
	"columns.ellipsis":  []string{"none", "start", "middle", "end"},
	"columns.hidden":    boolean, "columns.fixed": boolean, "columns.hex": boolean, "columns.alias": text,
	"json.skip":       boolean,
	"metrics.collect": boolean, "metrics.print": boolean,
	"metrics.type": []string{"key", "counter", "gauge", "histogram"},
	"metrics.name": text, "metrics.description": text, "metrics.unit": text, "metrics.boundaries": text,
	"metrics.implicit-counter.name": text, "metrics.implicit-counter.description": text,
	"profiles.stack-fields": text, "profiles.value-field": text, "profiles.sample-attribute": boolean,
	"profiles.name": text, "profiles.type": text, "profiles.unit": text,
	"ebpf.map.flush-on-stop": boolean, "ebpf.iter.fetch-on-stop": boolean,
	"ebpf.formatter.enum": text, "ebpf.formatter.bitfield.separator": text,
	"cli.clear-screen-before": boolean, "cli.default-output-mode": text, "cli.supported-output-modes": text,
	"flamegraph.level": count, "flamegraph.type": text,
}

func checkAnnotations(where string, as map[string]string) []error {
	var errs []error
	for _, key := range sortedKeys(as) {
		value := as[key]
		want, known := annotations[key]
		switch {
		case !known:
			errs = append(errs, fmt.Errorf("%s: unknown annotation %q", where, key))
		case want == text && value == "":
			errs = append(errs, fmt.Errorf("%s: %s is empty", where, key))
		case want == boolean && value != "true" && value != "false":
			errs = append(errs, fmt.Errorf("%s: %s is %q, want true or false", where, key, value))
		case want == count:
			if n, err := strconv.Atoi(value); err != nil || n <= 0 {
				errs = append(errs, fmt.Errorf("%s: %s is %q, want a positive number", where, key, value))
			}
		}
		if allowed, ok := want.([]string); ok && !slices.Contains(allowed, value) {
			errs = append(errs, fmt.Errorf("%s: %s is %q, want one of %s", where, key, value, strings.Join(allowed, ", ")))
		}
	}
	return errs
}

// checkAgainstObject makes sure every data source, field, parameter and
// program gadget.yaml names is in the object: IG derives them from it, and
// ignores the annotations of names it does not find.
func checkAgainstObject(m *Metadata, spec *ebpf.CollectionSpec) []error {
	var errs []error
	derived := &metadatav1.GadgetMetadata{}
	if err := types.Populate(derived, spec); err != nil {
		return []error{fmt.Errorf("read the object as IG does: %w", err)}
	}
	for _, name := range sortedKeys(m.DataSources) {
		have, ok := derived.DataSources[name]
		if !ok {
			errs = append(errs, fmt.Errorf("data source %s: not in the object (it has %s)", name, strings.Join(sortedKeys(derived.DataSources), ", ")))
			continue
		}
		for _, field := range sortedKeys(m.DataSources[name].Fields) {
			top, _, _ := strings.Cut(field, ".")
			if _, ok := have.Fields[top]; !ok && !addedByIG(have.Fields, top) {
				errs = append(errs, fmt.Errorf("data source %s, field %s: not in the object", name, field))
			}
		}
	}
	if err := types.Validate(&m.GadgetMetadata, spec); err != nil {
		errs = append(errs, err)
	}
	for _, name := range sortedKeys(m.Programs) {
		if spec.Programs[name] == nil {
			errs = append(errs, fmt.Errorf("programs: %s is not a program of the object", name))
		}
	}
	return errs
}

// addedByIG says whether IG's operators add field top to a data source
// with these fields: X beside X_raw (its formatters: an enum's name), and
// the pod's k8s.* and runtime.* beside a mount namespace (its enrichment,
// which finds it by its type, gadget_mntns_id: named mntns_id here, or in
// a gadget_process, proc).
func addedByIG(fields map[string]metadatav1.Field, top string) bool {
	if _, ok := fields[top+"_raw"]; ok {
		return true
	}
	if top != "k8s" && top != "runtime" {
		return false
	}
	_, mntns := fields["mntns_id"]
	_, proc := fields["proc"] // a gadget_process, which holds one
	return mntns || proc
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
