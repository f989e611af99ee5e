package pyroscope

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/pprof/profile"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// The exporter against the strict receiver (pyroscopetest), which refuses
// what a Pyroscope v2.2.1 server refuses.

// interval is a report of one process holding bytes (allocated, all live),
// at t.
func interval(t time.Time, bytes uint64) *snapshot.Snapshot {
	return snapshot.Snapshot{Time: t}.With([]snapshot.Row{
		row(1, 1, memory.KindDevice, "f", accounting.Counters{AllocBytes: bytes, AllocCount: bytes}),
	}...)
}

// liveBytes is the inuse_space of a push's first series.
func liveBytes(t *testing.T, raw []byte) int64 {
	t.Helper()
	p, err := profile.ParseData(raw)
	if err != nil {
		t.Fatal(err)
	}
	return p.Sample[0].Value[3]
}

// pushedLive is the live bytes of each push the receiver accepted.
func pushedLive(t *testing.T, r *receiver) []int64 {
	t.Helper()
	var out []int64
	for _, req := range r.Received() {
		out = append(out, liveBytes(t, req.Series[0].Samples[0].RawProfile))
	}
	return out
}

func equal(a, b []int64) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

// TestNoPushWithoutSeries: intervals in which no process holds or
// allocated memory are never sent (the server answers InvalidArgument "no
// profiles received"); they are not even queued.
func TestNoPushWithoutSeries(t *testing.T) {
	lis := listen(t)
	r := &receiver{}
	serve(t, r, lis)
	e := start(t, Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 4})

	t0 := time.Now()
	e.Export(&snapshot.Snapshot{Time: t0}) // no process yet
	// A process allocates and frees 100 bytes: something to push.
	freed := accounting.Counters{AllocBytes: 100, AllocCount: 1, FreeBytes: 100, FreeCount: 1}
	e.Export(snapshot.Snapshot{Time: t0.Add(time.Second)}.With([]snapshot.Row{row(1, 1, memory.KindDevice, "f", freed)}...))
	waitfor.Condition(t, "the first push", time.Minute, func() bool { return e.Stats().Pushed >= 1 })
	// Then nothing allocated and nothing live: every value zero.
	e.Export(snapshot.Snapshot{Time: t0.Add(2 * time.Second)}.With([]snapshot.Row{row(1, 1, memory.KindDevice, "f", freed)}...))
	e.Export(&snapshot.Snapshot{Time: t0.Add(3 * time.Second)})
	if s := e.Stats(); s.Queued != 0 {
		t.Errorf("empty intervals queued: %+v", s)
	}
	e.Export(interval(t0.Add(4*time.Second), 8))
	waitfor.Condition(t, "the second push", time.Minute, func() bool { return e.Stats().Pushed >= 2 })

	if got := pushedLive(t, r); !equal(got, []int64{0, 8}) {
		t.Errorf("pushed live bytes %v, want [0 8]", got)
	}
	if refused := r.Refused(); len(refused) != 0 {
		t.Errorf("receiver refused %v", refused)
	}
	if s := e.Stats(); s.Pushed != 2 || s.Failed != 0 || s.Rejected != 0 || s.Queued != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestRefusedContentDroppedAtOnce: a request the server refuses for its
// content is dropped after one attempt, counted with its reason, and the
// newer intervals behind it are delivered.
func TestRefusedContentDroppedAtOnce(t *testing.T) {
	t.Run("a node clock 11 minutes ahead", func(t *testing.T) {
		t.Parallel()
		lis := listen(t)
		r := &receiver{}
		serve(t, r, lis)
		e := start(t, Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 4})

		now := time.Now()
		e.Export(interval(now.Add(11*time.Minute), 1)) // beyond -validation.reject-newer-than
		e.Export(interval(now.Add(11*time.Minute+time.Second), 2))
		e.Export(interval(now.Add(2*time.Second), 3)) // the clock set right
		waitfor.Condition(t, "the third interval", time.Minute, func() bool { return e.Stats().Pushed >= 1 })

		s := e.Stats()
		if s.Rejected != 2 || s.RejectedBy["InvalidArgument"] != 2 || s.Failed != 0 || s.Queued != 0 || s.LastError != "" {
			t.Errorf("stats %+v", s)
		}
		if !strings.HasPrefix(s.LastRejection, "InvalidArgument: ") || !strings.Contains(s.LastRejection, "outside of ingestion window") {
			t.Errorf("last rejection %q", s.LastRejection)
		}
		if n := len(r.Refused()); n != 2 {
			t.Errorf("%d attempts refused, want 2: one each", n)
		}
		if got := pushedLive(t, r); !equal(got, []int64{3}) {
			t.Errorf("pushed %v, want [3]", got)
		}
	})
	for _, code := range []codes.Code{codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange} {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			lis := listen(t)
			r := &receiver{}
			r.FailNext(1, code)
			serve(t, r, lis)
			e := start(t, Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 4})

			now := time.Now()
			e.Export(interval(now, 1))
			e.Export(interval(now.Add(time.Second), 2))
			waitfor.Condition(t, "the second interval", time.Minute, func() bool { return e.Stats().Pushed >= 1 })
			s := e.Stats()
			if s.Rejected != 1 || s.RejectedBy[code.String()] != 1 || s.Failed != 0 || s.Queued != 0 {
				t.Errorf("stats %+v", s)
			}
			if want := code.String() + ": injected " + code.String(); s.LastRejection != want {
				t.Errorf("last rejection %q, want %q", s.LastRejection, want)
			}
			if got := pushedLive(t, r); !equal(got, []int64{2}) {
				t.Errorf("pushed %v, want [2]", got)
			}
		})
	}
}

// TestTransientFailuresRetried: what may pass later is retried with
// backoff until delivered, and nothing is dropped.
func TestTransientFailuresRetried(t *testing.T) {
	for _, code := range []codes.Code{codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded,
		codes.Aborted, codes.Internal, codes.Unknown, codes.Unauthenticated, codes.PermissionDenied} {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			lis := listen(t)
			r := &receiver{}
			r.FailNext(2, code)
			serve(t, r, lis)
			e := start(t, Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 4})

			e.Export(interval(time.Now(), 7))
			waitfor.Condition(t, "delivery", time.Minute, func() bool { return e.Stats().Pushed >= 1 })
			s := e.Stats()
			if s.Failed != 2 || s.Rejected != 0 || s.Dropped != 0 || s.Queued != 0 || s.LastError != "" {
				t.Errorf("stats %+v", s)
			}
			if n := len(r.Refused()); n != 2 {
				t.Errorf("%d refused attempts, want 2", n)
			}
			if got := pushedLive(t, r); !equal(got, []int64{7}) {
				t.Errorf("pushed %v, want [7]", got)
			}
		})
	}
}

// TestAuthFailureHoldsNoMoreThanTheQueue: while credentials are refused,
// intervals keep queueing and the oldest are dropped beyond the queue's
// bound; once they pass, the newest intervals are delivered, in order.
func TestAuthFailureHoldsNoMoreThanTheQueue(t *testing.T) {
	lis := listen(t)
	r := &receiver{Auth: "Bearer rotated"}
	serve(t, r, lis)
	e := start(t, Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 3, Token: "s3cret"})

	t0 := time.Now()
	for i := range 7 {
		e.Export(interval(t0.Add(time.Duration(i)*time.Second), uint64(i+1)))
	}
	waitfor.Condition(t, "a refused attempt", time.Minute, func() bool { return e.Stats().Failed > 0 })
	s := e.Stats()
	if s.Dropped != 4 || s.Queued != 3 || s.Rejected != 0 || s.Pushed != 0 {
		t.Errorf("while refused: %+v", s)
	}
	if !strings.Contains(s.LastError, "Unauthenticated") || strings.Contains(s.LastError, "s3cret") {
		t.Errorf("last error %q", s.LastError)
	}

	r.SetAuth("Bearer s3cret")
	waitfor.Condition(t, "the queue to drain", time.Minute, func() bool { return e.Stats().Pushed >= 3 })
	if got := pushedLive(t, r); !equal(got, []int64{5, 6, 7}) {
		t.Errorf("pushed %v, want the newest three [5 6 7]", got)
	}
	if s := e.Stats(); s.Dropped != 4 || s.Queued != 0 || s.Rejected != 0 {
		t.Errorf("after: %+v", s)
	}
}

// clock is a settable clock, shared by the exporter and the receiver.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// TestExpiredIntervalsDropped: an outage of an hour, played on a clock
// that both sides read. What the queue held that the server would refuse
// as too old is dropped unsent and counted; the rest is delivered.
func TestExpiredIntervalsDropped(t *testing.T) {
	lis := listen(t)
	addr := lis.Addr().String()
	lis.Close()
	t0 := time.Now()
	c := &clock{now: t0}
	e := startWithClock(t, Config{URL: "http://" + addr, Interval: time.Minute, QueueSize: 8}, c.Now)

	for i, at := range []time.Duration{0, 3 * time.Minute, 21 * time.Minute, 41 * time.Minute} {
		c.set(t0.Add(at))
		e.Export(interval(t0.Add(at), uint64(i+1)))
	}
	waitfor.Condition(t, "a failed attempt", time.Minute, func() bool { return e.Stats().Failed > 0 })
	// 61 minutes after the first interval: the first two are past the
	// server's hour, the third 40 minutes old.
	c.set(t0.Add(61 * time.Minute))
	waitfor.Condition(t, "the old intervals to expire", time.Minute, func() bool { return e.Stats().Expired >= 2 })

	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	r := &receiver{Now: c.Now}
	serve(t, r, lis)
	waitfor.Condition(t, "the rest delivered", time.Minute, func() bool { return e.Stats().Pushed >= 2 })
	if got := pushedLive(t, r); !equal(got, []int64{3, 4}) {
		t.Errorf("pushed %v, want [3 4]", got)
	}
	if refused := r.Refused(); len(refused) != 0 {
		t.Errorf("receiver refused %v", refused)
	}
	if s := e.Stats(); s.Expired != 2 || s.Dropped != 0 || s.Rejected != 0 || s.Queued != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestPlainHTTPAnswers: a proxy answering with a plain HTTP status, no
// gRPC: 400, 413 and 422 refuse the request, which is dropped; 429 and
// 5xx are retried.
func TestPlainHTTPAnswers(t *testing.T) {
	for _, tc := range []struct {
		status  int
		dropped bool
	}{{400, true}, {413, true}, {422, true}, {429, false}, {502, false}, {503, false}} {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			t.Parallel()
			lis := listen(t)
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "proxy says no", tc.status)
			})}
			srv.Protocols = new(http.Protocols)
			srv.Protocols.SetUnencryptedHTTP2(true) // gRPC's cleartext HTTP/2
			go srv.Serve(lis)
			t.Cleanup(func() { srv.Close() })
			e := start(t, Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 4})

			e.Export(interval(time.Now(), 1))
			reason := fmt.Sprintf("HTTP %d", tc.status)
			if tc.dropped {
				waitfor.Condition(t, "the rejection", time.Minute, func() bool { return e.Stats().Rejected >= 1 })
				if s := e.Stats(); s.RejectedBy[reason] != 1 || s.Failed != 0 || s.Queued != 0 || !strings.HasPrefix(s.LastRejection, reason+": ") {
					t.Errorf("stats %+v", s)
				}
				return
			}
			waitfor.Condition(t, "two failed attempts", time.Minute, func() bool { return e.Stats().Failed >= 2 })
			if s := e.Stats(); s.Rejected != 0 || s.Queued != 1 || !strings.Contains(s.LastError, fmt.Sprint(tc.status)) {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// TestJudge: each answer's verdict and reason.
func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		err    error
		want   verdict
		reason string
	}{
		{status.Error(codes.InvalidArgument, "no profiles received"), drop, "InvalidArgument"},
		{status.Error(codes.FailedPrecondition, "x"), drop, "FailedPrecondition"},
		{status.Error(codes.OutOfRange, "x"), drop, "OutOfRange"},
		{status.Error(codes.Internal, "unexpected HTTP status code received from server: 400 (Bad Request)"), drop, "HTTP 400"},
		{status.Error(codes.Unknown, "unexpected HTTP status code received from server: 413 (Request Entity Too Large); transport: received unexpected content-type \"text/plain\""), drop, "HTTP 413"},
		{status.Error(codes.Unknown, "unexpected HTTP status code received from server: 422 (Unprocessable Entity)"), drop, "HTTP 422"},
		{status.Error(codes.Unavailable, "unexpected HTTP status code received from server: 429 (Too Many Requests)"), retry, "HTTP 429"},
		{status.Error(codes.Unknown, "unexpected HTTP status code received from server: 500 (Internal Server Error)"), retry, "HTTP 500"},
		{status.Error(codes.Unavailable, "connection refused"), retry, "Unavailable"},
		{status.Error(codes.ResourceExhausted, "push rate limit"), retry, "ResourceExhausted"},
		{status.Error(codes.DeadlineExceeded, "x"), retry, "DeadlineExceeded"},
		{status.Error(codes.Aborted, "x"), retry, "Aborted"},
		{status.Error(codes.Internal, "x"), retry, "Internal"},
		{status.Error(codes.Unknown, "x"), retry, "Unknown"},
		{status.Error(codes.Unauthenticated, "x"), retry, "Unauthenticated"},
		{status.Error(codes.PermissionDenied, "x"), retry, "PermissionDenied"},
		{errors.New("dial tcp: connection refused"), retry, "Unavailable"},
		{status.Error(codes.Internal, "grpc: error while marshaling: string field contains invalid UTF-8"), drop, "Marshal"},
	} {
		if v, reason := judge(tc.err); v != tc.want || reason != tc.reason {
			t.Errorf("%v: %v %q, want %v %q", tc.err, v, reason, tc.want, tc.reason)
		}
	}
}

// TestLabelsAreUTF8: a process name cut inside a character is sent with
// the character replaced, since gRPC cannot send a label that is not UTF-8.
func TestLabelsAreUTF8(t *testing.T) {
	e, err := New(Config{URL: "http://127.0.0.1:1", Interval: time.Second, QueueSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	r := row(1, 1, memory.KindDevice, "f", accounting.Counters{AllocBytes: 1, AllocCount: 1})
	r.Comm = "trainer-\xe6\x97"
	for _, l := range e.labels(r, seriesKey{}, views{}) {
		if l.Name == schema.Comm && l.Value != "trainer-\uFFFD" || !utf8.ValidString(l.Value) {
			t.Errorf("label %s=%q", l.Name, l.Value)
		}
	}
}

// TestNamesAreUTF8: a process and a function named with bytes that are not
// UTF-8 are pushed, as U+FFFD, where Pyroscope would refuse the profile.
func TestNamesAreUTF8(t *testing.T) {
	lis := listen(t)
	r := &receiver{}
	serve(t, r, lis)
	e := start(t, Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 4})
	bad := row(1, 1, memory.KindDevice, "load_\xe6\x97", accounting.Counters{AllocBytes: 10, AllocCount: 1})
	bad.Comm = "trainer-\xe6\x97"
	e.Export(snapshot.Snapshot{Time: time.Now()}.With([]snapshot.Row{bad}...))
	waitfor.Condition(t, "a push", time.Minute, func() bool { return e.Stats().Pushed+e.Stats().Rejected > 0 })
	if s := e.Stats(); s.Pushed != 1 || s.Rejected != 0 {
		t.Fatalf("stats %+v", s)
	}
	p, err := profile.ParseData(r.Received()[0].Series[0].Samples[0].RawProfile)
	if err != nil {
		t.Fatal(err)
	}
	if fn := p.Sample[0].Location[1].Line[0].Function.Name; fn != "load_\uFFFD" {
		t.Errorf("function %q", fn)
	}
}

// TestDescribeLongMessage: a refusal quoting long values keeps what it
// says about them.
func TestDescribeLongMessage(t *testing.T) {
	long := strings.Repeat("s", 3000)
	msg := "profile with labels '{pid=\"1\", service_name=\"" + long + "\"}' has label value too long: '" + long + "'"
	got := describe("InvalidArgument", status.Error(codes.InvalidArgument, msg))
	short := strings.Repeat("s", 64-len("service_name=\"")) + "..."
	want := "InvalidArgument: profile with labels '{pid=\"1\", service_name=\"" + short + " has label value too long: '" + strings.Repeat("s", 63) + "..."
	if got != want {
		t.Errorf("%q\nwant %q", got, want)
	}
}
