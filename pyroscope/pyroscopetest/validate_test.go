package pyroscopetest

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	typesv1 "github.com/grafana/pyroscope/api/gen/proto/go/types/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// memory is a profile of one sample, taken at t.
func memory(t time.Time) *profile.Profile {
	fn := &profile.Function{ID: 1, Name: "alloc", Filename: "train.py"}
	loc := &profile.Location{ID: 1, Line: []profile.Line{{Function: fn, Line: 3}}}
	return &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "alloc_space", Unit: "bytes"}, {Type: "inuse_space", Unit: "bytes"}},
		Sample:     []*profile.Sample{{Location: []*profile.Location{loc}, Value: []int64{4096, 4096}, Label: map[string][]string{"kind": {"device"}}}},
		Location:   []*profile.Location{loc},
		Function:   []*profile.Function{fn},
		TimeNanos:  t.UnixNano(),
	}
}

// raw is p gzipped, as pushed.
func raw(t *testing.T, p *profile.Profile) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := p.Write(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// uncompressed is p as it is, which the server takes too.
func uncompressed(t *testing.T, p *profile.Profile) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := p.WriteUncompressed(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// labels are pairs name, value, ...
func labels(nv ...string) []*typesv1.LabelPair {
	var out []*typesv1.LabelPair
	for i := 0; i < len(nv); i += 2 {
		out = append(out, &typesv1.LabelPair{Name: nv[i], Value: nv[i+1]})
	}
	return out
}

func push(ls []*typesv1.LabelPair, raws ...[]byte) *pushv1.PushRequest {
	s := &pushv1.RawProfileSeries{Labels: ls}
	for _, r := range raws {
		s.Samples = append(s.Samples, &pushv1.RawSample{RawProfile: r})
	}
	return &pushv1.PushRequest{Series: []*pushv1.RawProfileSeries{s}}
}

var good = []string{"__name__", "memory", "service_name", "train"}

func TestValidate(t *testing.T) {
	ok := raw(t, memory(now))
	manyLabels := append([]string(nil), good...)
	for i := range 27 { // with the sample's kind, 30
		manyLabels = append(manyLabels, fmt.Sprintf("l%02d", i), "v")
	}
	sampleLabels := memory(now)
	sampleLabels.Sample[0].Label["extra"] = []string{"x"}
	zero := memory(now)
	zero.Sample[0].Value = []int64{0, 0}
	negative := memory(now)
	negative.Sample[0].Value = []int64{-1, 4096}
	noTypes := memory(now)
	noTypes.SampleType, noTypes.Sample[0].Value = nil, nil
	dash := memory(now)
	dash.SampleType[0].Type = "alloc-space"
	badString := memory(now)
	badString.Function[0].Name = "\xff"
	big := memory(now)
	big.Comments = []string{strings.Repeat("x", 4<<20)}

	for _, tc := range []struct {
		name string
		req  *pushv1.PushRequest
		code codes.Code // OK: taken
		msg  string
	}{
		{"a memory profile", push(labels(good...), ok), codes.OK, ""},
		{"uncompressed", push(labels(good...), uncompressed(t, memory(now))), codes.OK, ""},
		{"gzipped twice", push(labels(good...), gzipped(t, ok)), codes.Unknown, ""},
		{"no series", &pushv1.PushRequest{}, codes.InvalidArgument, "no profiles received"},
		{"a series without samples", push(labels(good...)), codes.InvalidArgument, "no profiles received"},
		{"no __name__", push(labels("service_name", "train"), ok), codes.InvalidArgument, "invalid metric name"},
		{"an empty __name__", push(labels("__name__", "", "service_name", "train"), ok), codes.InvalidArgument, "invalid metric name"},
		{"no service_name: the fallback", push(labels("__name__", "memory"), ok), codes.OK, ""},
		{"an empty service_name", push(labels("__name__", "memory", "service_name", ""), ok), codes.InvalidArgument, "service name is not provided"},
		{"an empty label name", push(labels(append([]string{"", "v"}, good...)...), ok), codes.InvalidArgument, "invalid label name"},
		{"a label name not UTF-8", push(labels(append([]string{"k\xff", "v"}, good...)...), ok), codes.InvalidArgument, "invalid label name"},
		{"a label value not UTF-8", push(labels(append([]string{"pod", "\xff"}, good...)...), ok), codes.InvalidArgument, "invalid label value"},
		{"a dotted label name", push(labels(append([]string{"k8s.pod", "v"}, good...)...), ok), codes.OK, ""},
		{"an empty label value: dropped", push(labels(append([]string{"pod", ""}, good...)...), ok), codes.OK, ""},
		{"a duplicate label", push(labels(append([]string{"pod", "a", "pod", "b"}, good...)...), ok), codes.InvalidArgument, "duplicate label name"},
		{"30 labels", push(labels(manyLabels...), ok), codes.OK, ""},
		{"31 labels", push(labels(append(manyLabels, "l99", "v")...), ok), codes.InvalidArgument, "has 31 label names; limit 30"},
		{"31 with a sample's label", push(labels(manyLabels...), raw(t, sampleLabels)), codes.InvalidArgument, "has 31 label names; limit 30"},
		{"invalid labels, every value zero", push(labels("service_name", "train"), raw(t, withPeriod(zero))), codes.OK, ""},
		{"a negative value", push(labels(good...), raw(t, withPeriod(negative))), codes.OK, ""},
		{"every value zero, no period type", push(labels(good...), raw(t, zero)), codes.Unknown, "nil pointer dereference"},
		{"a negative value, no period type", push(labels(good...), raw(t, negative)), codes.Unknown, "nil pointer dereference"},
		{"a label name too long", push(labels(append([]string{strings.Repeat("n", 1025), "v"}, good...)...), ok), codes.InvalidArgument, "label name too long"},
		{"a label value too long", push(labels(append([]string{"pod", strings.Repeat("v", 2049)}, good...)...), ok), codes.InvalidArgument, "label value too long"},
		{"59 minutes old", push(labels(good...), raw(t, memory(now.Add(-59*time.Minute)))), codes.OK, ""},
		{"61 minutes old", push(labels(good...), raw(t, memory(now.Add(-61*time.Minute)))), codes.InvalidArgument, "outside of ingestion window"},
		{"an hour old to the millisecond", push(labels(good...), raw(t, memory(now.Add(-time.Hour)))), codes.InvalidArgument, "outside of ingestion window"},
		{"9 minutes ahead", push(labels(good...), raw(t, memory(now.Add(9*time.Minute)))), codes.OK, ""},
		{"11 minutes ahead", push(labels(good...), raw(t, memory(now.Add(11*time.Minute)))), codes.InvalidArgument, "outside of ingestion window"},
		{"no time: the server's", push(labels(good...), raw(t, memory(time.Unix(0, 0)))), codes.OK, ""},
		{"no sample types", push(labels(good...), raw(t, noTypes)), codes.InvalidArgument, "empty profile"},
		{"no bytes", push(labels(good...), []byte{}), codes.Unknown, "gzip reset: EOF"},
		{"an empty profile", push(labels(good...), gzipped(t, nil)), codes.InvalidArgument, "empty profile"},
		{"a sample type with -", push(labels(good...), raw(t, dash)), codes.InvalidArgument, "sample type contains -"},
		{"a string not UTF-8", push(labels(good...), raw(t, badString)), codes.InvalidArgument, "invalid utf8 string"},
		{"over 4 MiB uncompressed", push(labels(good...), raw(t, big)), codes.InvalidArgument, "uncompressed profile payload size exceeds limit"},
		{"not a profile", push(labels(good...), []byte("\x0a\xff")), codes.Unknown, ""},
		{"a broken gzip", push(labels(good...), []byte{0x1f, 0x8b, 0, 0}), codes.Unknown, ""},
	} {
		err := Validate(tc.req, now)
		if st := status.Convert(err); st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
			t.Errorf("%s: %v, want %v %q", tc.name, err, tc.code, tc.msg)
		}
	}
}

// TestReceiverOverGRPC: the refusals and faults reach a gRPC client with
// their codes, and are kept apart from what was accepted.
func TestReceiverOverGRPC(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{Now: func() time.Time { return now }}
	Serve(t, r, lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pushv1.NewPusherServiceClient(conn)
	ctx := context.Background()

	r.FailNext(1, codes.ResourceExhausted)
	r.FailNext(1, codes.Unavailable)
	accepted := push(labels(good...), raw(t, memory(now)))
	for _, want := range []codes.Code{codes.ResourceExhausted, codes.Unavailable, codes.OK} {
		if _, err := client.Push(ctx, accepted); status.Code(err) != want {
			t.Errorf("push: %v, want %v", err, want)
		}
	}
	if _, err := client.Push(ctx, &pushv1.PushRequest{}); status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != "no profiles received" {
		t.Errorf("empty push: %v", err)
	}
	r.SetAuth("Bearer t")
	if _, err := client.Push(ctx, accepted); status.Code(err) != codes.Unauthenticated {
		t.Errorf("without credentials: %v", err)
	}
	if n, m := len(r.Received()), len(r.Refused()); n != 1 || m != 4 {
		t.Errorf("%d accepted and %d refused, want 1 and 4", n, m)
	}
}

// withPeriod is a copy of p with a period type, as gpu-mem writes.
func withPeriod(p *profile.Profile) *profile.Profile {
	p = p.Copy()
	p.PeriodType, p.Period = &profile.ValueType{Type: "space", Unit: "bytes"}, 1
	return p
}

func gzipped(t *testing.T, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write(data)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
