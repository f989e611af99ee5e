// Package pyroscopetest runs a real push.v1.PusherService, the API module's
// generated gRPC service, on a loopback listener, for tests. It refuses what
// a Grafana Pyroscope v2.2.1 server refuses, with the same gRPC codes, so
// that a test passes only with pushes the real server takes.
//
// Each refusal names the server code it mirrors, in grafana/pyroscope at tag
// v2.2.1 (commit df3c0391b7dfc9c9577a55be4ebfcf2f0ac65d71), with the
// server's default limits. The server answers over connect; its codes reach
// a gRPC client unchanged, and its message is that of the innermost
// connect error (Distributor.Push gathers the series' errors in a dskit
// multierror, which errors.As looks through).
package pyroscopetest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Receiver keeps every push it accepts, and every refusal.
type Receiver struct {
	pushv1.UnimplementedPusherServiceServer
	// Auth is the authorization header required, if set (SetAuth changes
	// it while the receiver serves).
	Auth string
	// Now is the server's clock, which places its ingestion window; nil:
	// time.Now.
	Now func() time.Time

	mu       sync.Mutex
	requests []*pushv1.PushRequest
	metadata []metadata.MD
	refused  []error
	faults   []codes.Code // the answers to the next pushes, before any check
}

// Push accepts a push, or refuses it as Pyroscope would.
func (r *Receiver) Push(ctx context.Context, req *pushv1.PushRequest) (*pushv1.PushResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	err := r.admit(md)
	if err == nil {
		err = Validate(req, r.now())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.refused = append(r.refused, err)
		return nil, err
	}
	r.requests = append(r.requests, req)
	r.metadata = append(r.metadata, md)
	return &pushv1.PushResponse{}, nil
}

// admit checks the credentials and plays the faults asked for.
func (r *Receiver) admit(md metadata.MD) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Pyroscope itself checks no password: a gateway before it does, and
	// its own tenant interceptor (pkg/tenant/interceptor.go) answers
	// Unauthenticated when multi-tenancy is on and X-Scope-OrgID is
	// missing.
	if r.Auth != "" && (len(md["authorization"]) != 1 || md["authorization"][0] != r.Auth) {
		return status.Error(codes.Unauthenticated, "invalid credentials")
	}
	if len(r.faults) > 0 {
		code := r.faults[0]
		r.faults = r.faults[1:]
		return fault(code)
	}
	return nil
}

// fault is a refusal that depends on the moment, not on the request.
func fault(code codes.Code) error {
	switch code {
	case codes.ResourceExhausted:
		// Distributor.rateLimit (pkg/distributor/distributor.go): the
		// tenant's ingestion rate, 4 MB/s with a 2 MB burst by default.
		return status.Error(code, "push rate limit (4.0 MiB) exceeded while adding 1.2 KiB")
	case codes.Unavailable:
		// What a client sees while the server restarts or no segment
		// writer is ready.
		return status.Error(code, "connection refused")
	}
	return status.Error(code, "injected "+code.String())
}

// FailNext has the next n pushes refused with code, before anything else
// is checked: ResourceExhausted as the server's rate limit answers,
// Unavailable as a server down, or any other code.
func (r *Receiver) FailNext(n int, code codes.Code) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for range n {
		r.faults = append(r.faults, code)
	}
}

// SetAuth changes the authorization header required.
func (r *Receiver) SetAuth(auth string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Auth = auth
}

func (r *Receiver) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Received returns the pushes accepted so far.
func (r *Receiver) Received() []*pushv1.PushRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*pushv1.PushRequest(nil), r.requests...)
}

// Take returns the pushes accepted since the last Take, and forgets them:
// a long run reads them as they come rather than keeping them all.
// Received then returns only those accepted since.
func (r *Receiver) Take() []*pushv1.PushRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	taken := r.requests
	r.requests, r.metadata = nil, nil
	return taken
}

// Refused returns the errors of the pushes refused so far, in order.
func (r *Receiver) Refused() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.refused...)
}

// Metadata returns the gRPC metadata of each accepted push.
func (r *Receiver) Metadata() []metadata.MD {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]metadata.MD(nil), r.metadata...)
}

// maxMessage is the largest push the server reads: connect's
// WithReadMaxBytes at -distributor.ingestion-body-limit-mb, 256 MB
// (connectOptionsAuthDelayRecovery, pkg/api/connect_options.go), where
// grpc-go's server would stop at 4 MiB.
const maxMessage = 256 << 20

// Serve runs r on lis until the test ends.
func Serve(t testing.TB, r *Receiver, lis net.Listener, opts ...grpc.ServerOption) {
	t.Cleanup(Start(r, lis, opts...).Stop)
}

// Loopback runs a new receiver on a port of the loopback interface until
// the test ends, and returns it and its address.
func Loopback(t testing.TB) (*Receiver, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{}
	Serve(t, r, lis)
	return r, lis.Addr().String()
}

// Start runs r on lis until the server returned is stopped: a server that
// goes away and comes back (the soak) starts r again on a new listener.
func Start(r *Receiver, lis net.Listener, opts ...grpc.ServerOption) *grpc.Server {
	s := grpc.NewServer(append([]grpc.ServerOption{grpc.MaxRecvMsgSize(maxMessage)}, opts...)...)
	pushv1.RegisterPusherServiceServer(s, r)
	go s.Serve(lis)
	return s
}

// Labels are a pushed series' labels by name.
func Labels(s *pushv1.RawProfileSeries) map[string]string {
	m := map[string]string{}
	for _, l := range s.Labels {
		m[l.Name] = l.Value
	}
	return m
}

// ProfileTypeID is the profile type Pyroscope files a sample type of a
// series' profile under (__name__:sample_type:sample_unit:period_type:
// period_unit, as pprofsplit and the query API name it): what a Grafana
// panel's profileTypeId selects.
func ProfileTypeID(s *pushv1.RawProfileSeries, p *profile.Profile, st *profile.ValueType) string {
	period := &profile.ValueType{}
	if p.PeriodType != nil {
		period = p.PeriodType
	}
	return Labels(s)[labelName] + ":" + st.Type + ":" + st.Unit + ":" + period.Type + ":" + period.Unit
}

// Totals sums the values of a push per profile type, over every series
// and sample: what a query of one profile type with no label filter shows
// for that push (SelectMergeStacktraces' total).
func Totals(req *pushv1.PushRequest) (map[string]int64, error) {
	totals := map[string]int64{}
	for _, s := range req.Series {
		for _, raw := range s.Samples {
			p, err := profile.ParseData(raw.RawProfile)
			if err != nil {
				return nil, err
			}
			for i, st := range p.SampleType {
				id := ProfileTypeID(s, p, st)
				for _, sample := range p.Sample {
					totals[id] += sample.Value[i]
				}
			}
		}
	}
	return totals, nil
}
