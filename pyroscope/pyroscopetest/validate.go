package pyroscopetest

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/pprof/profile"
	profilev1 "github.com/grafana/pyroscope/api/gen/proto/go/google/v1"
	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	typesv1 "github.com/grafana/pyroscope/api/gen/proto/go/types/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The server's default limits (pkg/validation/limits.go, Limits.RegisterFlags).
const (
	rejectOlderThan        = time.Hour        // -validation.reject-older-than
	rejectNewerThan        = 10 * time.Minute // -validation.reject-newer-than
	maxProfileSize         = 4 << 20          // -validation.max-profile-size-bytes, uncompressed
	maxSamples             = 16000            // -validation.max-profile-stacktrace-samples
	maxSampleLabels        = 100              // -validation.max-profile-stacktrace-sample-labels
	maxLabelNamesPerSeries = 30               // -validation.max-label-names-per-series
	maxLabelNameLength     = 1024             // -validation.max-length-label-name
	maxLabelValueLength    = 2048             // -validation.max-length-label-value
)

// Label names the server gives a meaning.
const (
	labelName    = "__name__"
	labelService = "service_name"
	// serviceFallback is the service_name of a series without one
	// (AttrServiceNameFallback, pkg/model/labels.go).
	serviceFallback = "unknown_service"
)

// series is one pushed profile with its series' labels.
type series struct {
	labels  []*typesv1.LabelPair
	profile *profile.Profile
}

// Validate refuses a push as a Pyroscope v2.2.1 server does, checking in
// the server's order; nil if the server would take it.
//
// One difference: the server stores the valid series of a request that it
// answers with an error for another series; Validate refuses the whole
// request, so that a test never counts data its exporter saw refused.
func Validate(req *pushv1.PushRequest, now time.Time) error {
	// Distributor.Push (pkg/distributor/distributor.go) decodes every
	// sample's profile first.
	var all []series
	for _, s := range req.Series {
		for _, sample := range s.Samples {
			p, err := decode(sample.RawProfile)
			if err != nil {
				return err
			}
			all = append(all, series{labels: s.Labels, profile: p})
		}
	}
	// Distributor.PushBatch: a push whose series hold no sample.
	if len(all) == 0 {
		return status.Error(codes.InvalidArgument, "no profiles received")
	}
	for _, s := range all {
		if err := validateSeries(s, now); err != nil {
			return err
		}
	}
	return nil
}

// decode reads a raw profile as Distributor.Push does with
// pprof.RawFromBytesWithLimit (pkg/pprof/pprof.go): gzipped or not, at most
// maxProfileSize once uncompressed.
func decode(raw []byte) (*profile.Profile, error) {
	// The server reads a gzip header from every profile: one without it
	// is taken as it is, but one too short to hold a header fails.
	// Neither error is a validation error: connect answers Unknown.
	data := raw
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	switch {
	case err == nil:
		if data, err = io.ReadAll(io.LimitReader(zr, maxProfileSize+1)); err != nil {
			return nil, status.Errorf(codes.Unknown, "copy to buffer: %v", err)
		}
	case err != gzip.ErrHeader:
		return nil, status.Errorf(codes.Unknown, "gzip reset: %v", err)
	}
	if len(data) > maxProfileSize {
		// A validation error (ProfileSizeLimit), which Distributor.Push's
		// deferred wrapper answers InvalidArgument.
		return nil, status.Error(codes.InvalidArgument, "uncompressed profile payload size exceeds limit of 4.2 MB")
	}
	// The server decodes with the generated UnmarshalVT, whose error is
	// no validation error: Unknown.
	pb := new(profilev1.Profile)
	if err := pb.UnmarshalVT(data); err != nil {
		return nil, status.Errorf(codes.Unknown, "%v", err)
	}
	// ValidateProfile's first check, made here because pprof's reader
	// refuses such a profile in its own words.
	if len(pb.SampleType) == 0 {
		return nil, status.Error(codes.InvalidArgument, "empty profile")
	}
	// What decodes but pprof's reader refuses (indexes out of range, IDs
	// of 0, values that do not match the sample types) ValidateProfile
	// refuses as malformed.
	p, err := profile.ParseUncompressed(data)
	if err == nil {
		err = p.CheckValid()
	}
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "malformed profile: %v", err)
	}
	if pb.PeriodType == nil {
		p.PeriodType = nil // as sent: pprof's reader makes up an empty one
	}
	return p, nil
}

// validateSeries checks one profile in Distributor.pushSeries's order:
// ValidateProfile, then normalization, then the labels of each group of
// samples (Distributor.visitSampleSeries). Each refusal is InvalidArgument.
func validateSeries(s series, now time.Time) error {
	labels := withService(s.labels)
	if err := validateProfile(s.profile, labels, now); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	samples := kept(s.profile.Sample)
	if normalizePanics(s.profile, samples) {
		// Recovered by Distributor.PushBatch: no connect error, Unknown.
		return status.Error(codes.Unknown, "push series with index 0 and id  failed: runtime error: invalid memory address or nil pointer dereference")
	}
	for _, labels := range labelSets(labels, samples) {
		if err := validateLabels(labels); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	return nil
}

// validateProfile mirrors ValidateProfile (pkg/validation/validate.go);
// labels are the series', as its messages quote them.
func validateProfile(p *profile.Profile, labels []*typesv1.LabelPair, now time.Time) error {
	if len(p.SampleType) == 0 {
		return fmt.Errorf("empty profile")
	}
	// A profile without a time is given the server's; the window is in
	// milliseconds, both ends excluded (ingestionWindow.valid).
	if p.TimeNanos > 0 {
		t := p.TimeNanos / 1e6
		from, to := now.Add(-rejectOlderThan).UnixMilli(), now.Add(rejectNewerThan).UnixMilli()
		if t <= from || t >= to {
			return fmt.Errorf("profile with labels '%s' is outside of ingestion window (profile timestamp: %s, the ingestion window starts at %s and ends at %s)",
				labelsString(sorted(labels)), millis(t), millis(from), millis(to))
		}
	}
	if len(p.Sample) > maxSamples {
		return fmt.Errorf("the profile exceeds the samples count limit (max_profile_stacktrace_samples, actual: %d, limit: %d)", len(p.Sample), maxSamples)
	}
	for _, s := range p.Sample {
		if n := sampleLabelCount(s); n > maxSampleLabels {
			return fmt.Errorf("the profile exceeds the sample labels limit (max_profile_stacktrace_sample_labels, actual: %d, limit: %d)", n, maxSampleLabels)
		}
	}
	for _, st := range p.SampleType {
		if strings.Contains(st.Type, "-") {
			return fmt.Errorf("sample type contains -")
		}
	}
	for _, str := range profileStrings(p) {
		if !utf8.ValidString(str) {
			return fmt.Errorf("invalid utf8 string hex: %x", str)
		}
	}
	return nil
}

// millis is a time as the server writes it (util.FormatTimeMillis).
func millis(ms int64) string { return time.UnixMilli(ms).UTC().String() }

func sampleLabelCount(s *profile.Sample) int {
	n := 0
	for _, v := range s.Label {
		n += len(v)
	}
	for _, v := range s.NumLabel {
		n += len(v)
	}
	return n
}

// profileStrings are the strings of the profile's string table that pprof's
// reader keeps.
func profileStrings(p *profile.Profile) []string {
	var all []string
	for _, st := range append(slices.Clone(p.SampleType), p.PeriodType) {
		if st != nil {
			all = append(all, st.Type, st.Unit)
		}
	}
	for _, s := range p.Sample {
		for k, vs := range s.Label {
			all = append(append(all, k), vs...)
		}
		for k := range s.NumLabel {
			all = append(all, k)
		}
	}
	for _, f := range p.Function {
		all = append(all, f.Name, f.SystemName, f.Filename)
	}
	for _, m := range p.Mapping {
		all = append(all, m.File, m.BuildID)
	}
	return append(append(all, p.Comments...), p.DropFrames, p.KeepFrames, p.DefaultSampleType)
}

// withService is pushSeries's first step: a series without service_name
// gets the fallback.
func withService(labels []*typesv1.LabelPair) []*typesv1.LabelPair {
	for _, l := range labels {
		if l.Name == labelService && l.Value != "" {
			return labels
		}
	}
	return append(slices.Clone(labels), &typesv1.LabelPair{Name: labelService, Value: serviceFallback})
}

// kept are the samples that Profile.Normalize (pkg/pprof/pprof.go) keeps:
// none with a negative value, none with every value zero. A profile left
// without samples is taken and nothing of it stored, its labels unchecked.
func kept(samples []*profile.Sample) []*profile.Sample {
	var out []*profile.Sample
	for _, s := range samples {
		if !slices.ContainsFunc(s.Value, func(v int64) bool { return v < 0 }) &&
			slices.ContainsFunc(s.Value, func(v int64) bool { return v > 0 }) {
			out = append(out, s)
		}
	}
	return out
}

// normalizePanics says whether Profile.Normalize (pkg/pprof/pprof.go)
// panics on p: once it has removed samples (kept says which stay), it drops
// the functions that only they used and then, in visitAllNameReferences,
// reads the period type without checking that there is one. A profile
// without a period type that so loses a function loses its push to a
// recovered panic, answered Unknown, which a client would retry forever.
// (gpu-mem's profiles always carry a period type.)
func normalizePanics(p *profile.Profile, kept []*profile.Sample) bool {
	if p.PeriodType != nil {
		return false
	}
	used := map[uint64]bool{} // the kept samples' locations
	for _, s := range kept {
		for _, l := range s.Location {
			used[l.ID] = true
		}
	}
	removed := map[uint64]bool{} // the other samples' locations
	for _, s := range p.Sample {
		for _, l := range s.Location {
			removed[l.ID] = !used[l.ID]
		}
	}
	left := map[uint64]bool{} // the functions of the locations left
	for _, l := range p.Location {
		for _, line := range l.Line {
			if line.Function != nil && !removed[l.ID] {
				left[line.Function.ID] = true
			}
		}
	}
	for _, l := range p.Location {
		for _, line := range l.Line {
			if line.Function != nil && !left[line.Function.ID] {
				return true
			}
		}
	}
	return false
}

// labelSets are the label sets of a series' samples, as the segment
// writer's path builds them (pprofsplit.VisitSampleSeries,
// pkg/model/pprofsplit/pprof_split.go, with phlaremodel.LabelsBuilder): the
// series' labels less those with an empty value (an empty label is a
// missing one, and removes every label of its name), plus each sample's
// string labels whose names the series lacks. Trace and span labels do not
// split series.
func labelSets(seriesLabels []*typesv1.LabelPair, samples []*profile.Sample) [][]*typesv1.LabelPair {
	empty := map[string]bool{}
	for _, l := range seriesLabels {
		if l.Value == "" {
			empty[l.Name] = true
		}
	}
	var base []*typesv1.LabelPair
	for _, l := range seriesLabels {
		if !empty[l.Name] {
			base = append(base, l)
		}
	}
	sets := map[string][]*typesv1.LabelPair{}
	for _, s := range samples {
		set := slices.Clone(base)
		names := make([]string, 0, len(s.Label))
		for name := range s.Label {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			switch name {
			case "trace_id", "span_id", "profile_id":
				continue
			}
			if v := s.Label[name]; len(v) > 0 && v[0] != "" && !hasLabel(set, name) {
				set = append(set, &typesv1.LabelPair{Name: name, Value: v[0]})
			}
		}
		sets[labelsKey(set)] = set
	}
	out := make([][]*typesv1.LabelPair, 0, len(sets))
	for _, set := range sets {
		out = append(out, set)
	}
	return out
}

func hasLabel(ls []*typesv1.LabelPair, name string) bool {
	return slices.ContainsFunc(ls, func(l *typesv1.LabelPair) bool { return l.Name == name && l.Value != "" })
}

func labelsKey(ls []*typesv1.LabelPair) string {
	var b strings.Builder
	for _, l := range ls {
		b.WriteString(l.Name + "\x00" + l.Value + "\x00")
	}
	return b.String()
}

// validateLabels mirrors ValidateLabels (pkg/validation/validate.go) with
// label sanitization off (-validation.disable-label-sanitization, on by
// default): names and values are checked as UTF-8.
func validateLabels(labels []*typesv1.LabelPair) error {
	if len(labels) == 0 {
		return fmt.Errorf("error at least one label pair is required per profile")
	}
	ls := sorted(labels)
	if len(ls) > maxLabelNamesPerSeries {
		return fmt.Errorf("profile series '%s' has %d label names; limit %d", labelsString(ls), len(ls), maxLabelNamesPerSeries)
	}
	if name := get(ls, labelName); name == "" || !utf8.ValidString(name) {
		return fmt.Errorf("invalid labels '%s' with error: invalid metric name", labelsString(ls))
	}
	if get(ls, labelService) == "" {
		return fmt.Errorf("invalid labels '%s' with error: service name is not provided", labelsString(ls))
	}
	last := ""
	for _, l := range ls {
		switch {
		case len(l.Name) > maxLabelNameLength:
			return fmt.Errorf("profile with labels '%s' has label name too long: '%s'", labelsString(ls), l.Name)
		case len(l.Value) > maxLabelValueLength:
			return fmt.Errorf("profile with labels '%s' has label value too long: '%s'", labelsString(ls), l.Value)
		case l.Name == "" || !utf8.ValidString(l.Name):
			return fmt.Errorf("invalid labels '%s' with error: invalid label name '%s'", labelsString(ls), l.Name)
		case !utf8.ValidString(l.Value):
			return fmt.Errorf("invalid labels '%s' with error: invalid label value '%s'", labelsString(ls), l.Value)
		case l.Name == last:
			return fmt.Errorf("profile with labels '%s' has duplicate label name: '%s'", labelsString(ls), l.Name)
		}
		last = l.Name
	}
	return nil
}

// sorted is ls by name, as the server sorts them.
func sorted(ls []*typesv1.LabelPair) []*typesv1.LabelPair {
	ls = slices.Clone(ls)
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].Name < ls[j].Name })
	return ls
}

// get is the value of the first label of that name, as Labels.Get.
func get(ls []*typesv1.LabelPair, name string) string {
	for _, l := range ls {
		if l.Name == name {
			return l.Value
		}
	}
	return ""
}

func labelsString(ls []*typesv1.LabelPair) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = fmt.Sprintf("%s=%q", l.Name, l.Value)
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
