// Package pyroscopetest runs a real push.v1.PusherService, the API module's
// generated gRPC service, on a loopback listener, for tests.
package pyroscopetest

import (
	"context"
	"net"
	"sync"
	"testing"

	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Receiver keeps every push it accepts.
type Receiver struct {
	pushv1.UnimplementedPusherServiceServer
	Auth string // the authorization header required, if set

	mu       sync.Mutex
	requests []*pushv1.PushRequest
	metadata []metadata.MD
}

// Push accepts a push, or refuses it as Pyroscope does without the right
// credentials.
func (r *Receiver) Push(ctx context.Context, req *pushv1.PushRequest) (*pushv1.PushResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if r.Auth != "" && (len(md["authorization"]) != 1 || md["authorization"][0] != r.Auth) {
		return nil, status.Error(codes.Unauthenticated, "invalid credentials")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests = append(r.requests, req)
	r.metadata = append(r.metadata, md)
	return &pushv1.PushResponse{}, nil
}

// Received returns the pushes accepted so far.
func (r *Receiver) Received() []*pushv1.PushRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*pushv1.PushRequest(nil), r.requests...)
}

// Metadata returns the gRPC metadata of each accepted push.
func (r *Receiver) Metadata() []metadata.MD {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]metadata.MD(nil), r.metadata...)
}

// Serve runs r on lis until the test ends.
func Serve(t testing.TB, r *Receiver, lis net.Listener, opts ...grpc.ServerOption) {
	s := grpc.NewServer(opts...)
	pushv1.RegisterPusherServiceServer(s, r)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
}

// Labels are a pushed series' labels by name.
func Labels(s *pushv1.RawProfileSeries) map[string]string {
	m := map[string]string{}
	for _, l := range s.Labels {
		m[l.Name] = l.Value
	}
	return m
}
