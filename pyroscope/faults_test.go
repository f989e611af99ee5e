package pyroscope

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
)

// Faults of the way to the server (issue 21, point 3; docs/faults.md):
// each is counted, retried, holds no more than the queue, and once the
// server answers again the newest intervals go out, in order.

// startWithTimeout starts an exporter whose pushes time out after timeout
// (pushTimeout in the agent).
func startWithTimeout(t *testing.T, cfg Config, timeout time.Duration) *Exporter {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.timeout = timeout
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; e.Close() })
	return e
}

// silentPeer accepts connections and never says a word on them, until
// it is closed, with every connection it took.
type silentPeer struct {
	lis   net.Listener
	mu    sync.Mutex
	conns []net.Conn
	done  chan struct{}
}

func newSilentPeer(lis net.Listener) *silentPeer {
	p := &silentPeer{lis: lis, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *silentPeer) close() {
	p.lis.Close()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

// TestServerThatNeverAnswers: a server that takes the connection and never
// answers. Each push gives up after its timeout and is retried; the queue
// holds --pyroscope-queue intervals, the oldest dropped and counted; once
// the server answers, the newest go out in order.
func TestServerThatNeverAnswers(t *testing.T) {
	const timeout = 300 * time.Millisecond
	for _, tc := range []struct {
		name string
		// hang starts a server at lis that never answers; answer makes the
		// one at the same address answer.
		hang func(t *testing.T, lis net.Listener, r *receiver) (answer func())
	}{
		{"a TCP peer that never speaks", func(t *testing.T, lis net.Listener, r *receiver) func() {
			p := newSilentPeer(lis)
			t.Cleanup(p.close)
			return func() {
				addr := lis.Addr().String()
				p.close()
				lis, err := net.Listen("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				serve(t, r, lis)
			}
		}},
		{"a gRPC server whose handler never returns", func(t *testing.T, lis net.Listener, r *receiver) func() {
			gate := make(chan struct{})
			hold := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
				select {
				case <-gate:
				case <-ctx.Done(): // the client gave up
					return nil, ctx.Err()
				}
				if dl, ok := ctx.Deadline(); ok && time.Until(dl) < 200*time.Millisecond {
					// About to be given up as the gate opened: not taken,
					// or the client could time out before the answer
					// reached it and its retry would be a second copy
					// (pushes are at least once).
					<-ctx.Done()
					return nil, ctx.Err()
				}
				return handler(ctx, req)
			}
			serve(t, r, lis, grpc.UnaryInterceptor(hold))
			return func() { close(gate) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lis := listen(t)
			r := &receiver{}
			answer := tc.hang(t, lis, r)
			e := startWithTimeout(t, Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 3}, timeout)

			t0 := time.Now()
			began := time.Now()
			for i := range 7 {
				e.Export(interval(t0.Add(time.Duration(i)*time.Second), uint64(i+1)))
			}
			waitfor.Condition(t, "two attempts timed out", time.Minute, func() bool { return e.Stats().Failed >= 2 })
			if took := time.Since(began); took < 2*timeout {
				t.Errorf("two attempts failed in %v, before their timeouts", took)
			}
			s := e.Stats()
			if s.Pushed != 0 || s.Dropped != 4 || s.Queued != 3 || s.Rejected != 0 || !strings.Contains(s.LastError, "DeadlineExceeded") {
				t.Errorf("while hanging: %+v", s)
			}
			if n := len(r.Received()); n != 0 {
				t.Errorf("%d pushes taken", n)
			}

			answer()
			waitfor.Condition(t, "the queue to drain", time.Minute, func() bool { return e.Stats().Pushed >= 3 })
			if got := pushedLive(t, r); !equal(got, []int64{5, 6, 7}) {
				t.Errorf("pushed %v, want the newest three [5 6 7]", got)
			}
			// Tracing never waited: a new interval goes out behind them.
			e.Export(interval(t0.Add(7*time.Second), 8))
			waitfor.Condition(t, "the next interval", time.Minute, func() bool { return e.Stats().Pushed >= 4 })
			if got := pushedLive(t, r); !equal(got, []int64{5, 6, 7, 8}) {
				t.Errorf("pushed %v", got)
			}
			if s := e.Stats(); s.Dropped != 4 || s.Queued != 0 || s.Rejected != 0 || s.LastError != "" {
				t.Errorf("after: %+v", s)
			}
		})
	}
}

// TestTLSFailsThenAGoodServer: an https:// URL whose server is not trusted
// (its certificate signed by another CA than --pyroscope-ca-file's), or
// speaks plain HTTP/2. The push fails with the cause in Stats, is retried,
// and once a trusted server answers at that address, it is delivered.
func TestTLSFailsThenAGoodServer(t *testing.T) {
	goodTLS, caFile := selfSigned(t)
	otherTLS, _ := selfSigned(t) // another key, another CA
	for _, tc := range []struct {
		name  string
		creds []grpc.ServerOption // of the bad server
		cause string
	}{
		{"untrusted certificate", []grpc.ServerOption{grpc.Creds(credentials.NewTLS(otherTLS))}, "certificate signed by unknown authority"},
		{"plain HTTP server", nil, "first record does not look like a TLS handshake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lis := listen(t)
			addr := lis.Addr().String()
			bad := grpc.NewServer(tc.creds...)
			badRecv := &receiver{}
			pushv1.RegisterPusherServiceServer(bad, badRecv)
			go bad.Serve(lis)
			t.Cleanup(bad.Stop)
			e := start(t, Config{URL: "https://" + addr, CAFile: caFile, Interval: time.Second, QueueSize: 2})

			e.Export(interval(time.Now(), 1))
			waitfor.Condition(t, "two failed attempts", time.Minute, func() bool { return e.Stats().Failed >= 2 })
			s := e.Stats()
			if s.Pushed != 0 || s.Queued != 1 || s.Rejected != 0 || s.Dropped != 0 || !strings.Contains(s.LastError, tc.cause) {
				t.Errorf("while failing: %+v", s)
			}
			if n := len(badRecv.Received()); n != 0 {
				t.Errorf("the untrusted server got %d pushes", n)
			}

			bad.Stop()
			lis, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			r := &receiver{}
			serve(t, r, lis, grpc.Creds(credentials.NewTLS(goodTLS)))
			waitfor.Condition(t, "delivery", time.Minute, func() bool { return e.Stats().Pushed >= 1 })
			if got := pushedLive(t, r); !equal(got, []int64{1}) {
				t.Errorf("pushed %v, want [1]", got)
			}
			if s := e.Stats(); s.Queued != 0 || s.Rejected != 0 || s.Dropped != 0 || s.LastError != "" {
				t.Errorf("after: %+v", s)
			}
		})
	}
}
