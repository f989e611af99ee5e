// Package pyroscope pushes GPU memory profiles to Grafana Pyroscope over
// native gRPC (push.v1.PusherService/Push): one profile per process, memory
// kind and device every interval, through a bounded queue that never blocks the
// tracer. The tensor view's series carry sample types of their own
// (tensor_inuse_space, ...): Pyroscope makes them profile types of their
// own, so that memory:inuse_space is the driver view alone, what the GPUs
// hold, with no label filter. Each series also carries the interval's peak
// (peak_space, tensor_peak_space): each stack's share of its process's
// most memory at once on its GPU during the interval. Only what the server takes is sent: no interval without series,
// none older than the server accepts, and a request the server refuses for
// its content is dropped, not retried (refusal.go).
package pyroscope

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/pprof/profile"
	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	typesv1 "github.com/grafana/pyroscope/api/gen/proto/go/types/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/breakdown"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/pprof"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// Labels every series carries besides a row's (package schema's);
// dashboards/gpu-mem.json queries them.
const (
	LabelName    = "__name__"
	LabelDelta   = "__delta__"
	LabelService = "service_name"
	LabelNode    = "node"
	// LabelCategory is the breakdown's category of a series' stacks
	// (Config.Categories), LabelLibrary library workspaces' library.
	LabelCategory = "category"
	LabelLibrary  = "library"
	ProfileName   = "memory"
	// LabelTensorViewSince is on a tensor series of a process whose tensor
	// view was switched on on demand: from when it holds (RFC 3339).
	LabelTensorViewSince = "tensor_view_since"
	// LabelDriverViewOffSince marks the series of a process whose driver
	// view its budget switched off: partial from then on.
	LabelDriverViewOffSince = "driver_view_off_since"
	// MallocProfileName names the series of Config.Malloc, as Inspektor
	// Gadget's profile_cuda gadget pushes them: Pyroscope files them as
	// process_cpu:malloc:bytes:: (no period type), and the dashboard
	// selects them by k8s_namespace and k8s_podName.
	MallocProfileName = "process_cpu"
	LabelIGNamespace  = "k8s_namespace"
	LabelIGPod        = "k8s_podName"
	LabelIGContainer  = "k8s_containerName"
)

// MallocProfileTypeID is the profile type of the Malloc series.
const MallocProfileTypeID = MallocProfileName + ":malloc:bytes::"

// ProfileTypeID is the profile type Pyroscope files sample type st of a
// pushed series under, by which queries name it (ProfileName, then st's
// type and unit, then the period's: memory:inuse_space:bytes:space:bytes).
func ProfileTypeID(st *profile.ValueType) string {
	return ProfileName + ":" + st.Type + ":" + st.Unit + ":" + pprof.PeriodType + ":" + pprof.PeriodUnit
}

// DefaultInterval is the agent's interval unless told otherwise: one
// profile per series each. A flame graph of held bytes or peaks over a
// range sums its intervals' profiles (Pyroscope merges by sum only), so
// the dashboard reads them over one interval of this length.
const DefaultInterval = 15 * time.Second

// Config says where and how to push.
type Config struct {
	URL       string        // http://host:4040 (cleartext HTTP/2) or https://host:4040 (TLS)
	Interval  time.Duration // one profile per process and kind per interval
	QueueSize int           // intervals kept while the server is unreachable

	// Service overrides service_name, by default the process name.
	Service string
	Node    string // the node label

	CAFile   string // TLS: trust these certificates instead of the system's
	User     string // basic auth user
	Password string // basic auth password (read from a file or the environment)
	Token    string // bearer token (read from a file or the environment)
	TenantID string // X-Scope-OrgID

	// Malloc adds, per process, the series Inspektor Gadget's GPU
	// observability dashboard reads (MallocProfileName): the bytes
	// allocated on the GPUs during each interval, as the dashboard's
	// Prometheus panels count them (memory.AllocatedOnGPU: neither pinned
	// host memory nor NVML's contexts and modules).
	Malloc bool

	// Categories splits each process's series by the breakdown's category
	// of its stacks (labels category and, for library workspaces,
	// library), so that a flame graph filters by category; nil: no split.
	Categories *breakdown.Rules
}

// Stats are the exporter's counts, for the agent's status line.
type Stats struct {
	Pushed   uint64 // intervals delivered
	Failed   uint64 // push attempts that failed and are retried
	Rejected uint64 // intervals the server refused for their content, dropped
	Dropped  uint64 // intervals dropped, oldest first, because the queue was full
	Expired  uint64 // intervals dropped unsent, older than the server accepts
	Queued   int    // intervals waiting

	// RejectedBy counts Rejected by reason: the gRPC code, or "HTTP 413"
	// for a proxy's plain HTTP answer.
	RejectedBy map[string]uint64
	// Credentials never appear in these.
	LastError     string // of the last attempt, if it failed and is retried
	LastRejection string // the last refusal: its reason and the server's message
}

// pending is a queued interval.
type pending struct {
	req *pushv1.PushRequest
	end time.Time // the interval's end, the time of its profiles; wall clock
}

// Exporter turns reports into pushes. Export and Stats may be called from
// any goroutine while Run sends.
type Exporter struct {
	cfg    Config
	conn   *grpc.ClientConn
	client pushv1.PusherServiceClient

	mu      sync.Mutex
	queue   []*pending
	ready   chan struct{} // signalled when the queue grows
	stats   Stats
	last    time.Time        // end of the previous interval
	now     func() time.Time // the clock that ages queued intervals
	timeout time.Duration    // of one push: pushTimeout (tests shorten it)

	// Export's, kept between intervals (Export is called from one
	// goroutine at a time).
	interval uint64
	series   map[seriesKey]*series
	gz       bytes.Buffer
	zw       *gzip.Writer
}

// views are the views of an interval's processes that label their series:
// the on-demand tensor views and the driver views switched off, as its
// snapshot lists them.
type views struct {
	tensors   []snapshot.TensorView
	driverOff []snapshot.DriverViewOff
}

// series is what one series keeps between intervals.
type series struct {
	// enc has the sample types of the series' view (pprof.SampleTypes): a
	// series is one kind of memory, so one view, and a tensor series'
	// types are the tensor view's own, which Pyroscope keeps apart as
	// profile types of their own (memory:tensor_inuse_space:...).
	enc    *pprof.Encoder
	seen   uint64 // the last interval with rows
	labels []*typesv1.LabelPair
}

// New checks the configuration and prepares the connection; nothing is
// dialled until the first push.
func New(cfg Config) (*Exporter, error) {
	target, creds, err := transport(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Interval <= 0 {
		return nil, errors.New("pyroscope interval must be positive")
	}
	if cfg.QueueSize <= 0 {
		return nil, errors.New("pyroscope queue must hold at least one interval")
	}
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(creds),
		grpc.WithUnaryInterceptor(authInterceptor(cfg)))
	if err != nil {
		return nil, fmt.Errorf("pyroscope %s: %w", cfg.URL, err)
	}
	return &Exporter{
		cfg:     cfg,
		conn:    conn,
		client:  pushv1.NewPusherServiceClient(conn),
		ready:   make(chan struct{}, 1),
		stats:   Stats{RejectedBy: map[string]uint64{}},
		last:    time.Now(),
		now:     time.Now,
		timeout: pushTimeout,
		series:  map[seriesKey]*series{},
	}, nil
}

// transport reads the URL: its scheme chooses cleartext or TLS.
func transport(cfg Config) (string, credentials.TransportCredentials, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return "", nil, fmt.Errorf("bad pyroscope URL %q: want http://HOST:PORT or https://HOST:PORT", cfg.URL)
	}
	switch u.Scheme {
	case "http":
		if cfg.CAFile != "" {
			return "", nil, fmt.Errorf("a CA file needs an https:// pyroscope URL, not %q", cfg.URL)
		}
		return hostPort(u, "80"), insecure.NewCredentials(), nil
	case "https":
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.CAFile != "" {
			pem, err := os.ReadFile(cfg.CAFile)
			if err != nil {
				return "", nil, fmt.Errorf("pyroscope CA file: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return "", nil, fmt.Errorf("pyroscope CA file %s holds no PEM certificate", cfg.CAFile)
			}
		}
		return hostPort(u, "443"), credentials.NewTLS(tc), nil
	}
	return "", nil, fmt.Errorf("bad pyroscope URL %q: scheme must be http or https", cfg.URL)
}

func hostPort(u *url.URL, port string) string {
	if u.Port() != "" {
		return u.Host
	}
	return u.Hostname() + ":" + port
}

// authInterceptor adds the credentials and tenant to every call.
func authInterceptor(cfg Config) grpc.UnaryClientInterceptor {
	var md []string
	switch {
	case cfg.Token != "":
		md = append(md, "authorization", "Bearer "+cfg.Token)
	case cfg.User != "":
		md = append(md, "authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(cfg.User+":"+cfg.Password)))
	}
	if cfg.TenantID != "" {
		md = append(md, "x-scope-orgid", cfg.TenantID)
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if len(md) > 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, md...)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// Export queues the interval ending with the snapshot: per process and
// kind, what was allocated since the previous export, what is live now
// and, if the snapshot has peaks, each stack's share of them: its peaks are
// taken as the interval's (Profiler.EndInterval's). When the queue is full,
// the oldest interval is dropped and counted. An interval without series
// (no process held or allocated memory) is not queued: Pyroscope refuses a
// push without series. It keeps nothing of the snapshot.
func (e *Exporter) Export(s *snapshot.Snapshot) {
	e.export(s.Time, s.EachRow, s.Peaks, s.Growing, views{tensors: s.TensorViews, driverOff: s.DriverViewsOff})
}

// export queues the interval ending at end, whose rows each hands to its
// argument one at a time, whose peaks are peaks, whose growing rows are
// growing and whose processes' views are v.
func (e *Exporter) export(end time.Time, each func(func(*snapshot.Row)), peaks []snapshot.Peak, growing []snapshot.Growing, v views) {
	req := e.request(end, each, peaks, growing, v)
	if len(req.Series) == 0 {
		// Pyroscope answers InvalidArgument "no profiles received"
		// (Distributor.PushBatch): nothing to send.
		return
	}
	e.mu.Lock()
	if len(e.queue) == e.cfg.QueueSize {
		e.queue[0] = nil // let the dropped request go
		e.queue = e.queue[1:]
		e.stats.Dropped++
	}
	// The wall clock, as the server reads the profile's time: a monotonic
	// reading would not count the time a suspended machine slept.
	e.queue = append(e.queue, &pending{req: req, end: end.Round(0)})
	e.mu.Unlock()
	select {
	case e.ready <- struct{}{}:
	default:
	}
}

// seriesKey names a series: a process's memory of one kind on one GPU,
// its growth there (growth: growth_space), or (malloc) its Malloc series.
type seriesKey struct {
	pid               uint32
	kind              memory.Kind
	gpu               string
	category, library string // the breakdown's, with Config.Categories
	malloc, growth    bool
}

// request builds the push of the interval ending at t.
func (e *Exporter) request(t time.Time, each func(func(*snapshot.Row)), peaks []snapshot.Peak, growing []snapshot.Growing,
	v views) *pushv1.PushRequest {
	e.interval++
	shares := pprof.PeakShares(peaks)
	var categories *breakdown.Categorizer
	if e.cfg.Categories != nil {
		categories = e.cfg.Categories.Categorizer()
	}
	each(func(row *snapshot.Row) {
		k := seriesKey{pid: row.PID, kind: row.Kind, gpu: row.GPU()}
		if categories != nil {
			k.category, k.library = categories.Category(row)
		}
		e.add(k, row, v).Add(row, shares[row.Key])
		if e.cfg.Malloc && memory.AllocatedOnGPU(row.Kind, row.Key.Device) {
			e.add(seriesKey{pid: row.PID, malloc: true}, row, v).Add(row, accounting.Amount{})
		}
	})
	for i := range growing {
		g := &growing[i]
		row := snapshot.Row{Key: g.Key, Comm: g.Comm, Device: g.Device, Container: g.Container}
		e.add(seriesKey{pid: g.PID, kind: g.Kind, gpu: g.GPU(), growth: true}, &row, v).AddGrowth(g)
	}
	start := e.last
	e.last = t
	keys := make([]seriesKey, 0, len(e.series))
	for k, s := range e.series {
		if s.seen == e.interval {
			keys = append(keys, k)
		} else {
			delete(e.series, k) // its process was dropped
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.pid != b.pid {
			return a.pid < b.pid
		}
		if a.malloc != b.malloc {
			return b.malloc
		}
		if a.growth != b.growth {
			return b.growth
		}
		if a.kind != b.kind {
			return a.kind < b.kind
		}
		if a.gpu != b.gpu {
			return a.gpu < b.gpu
		}
		if a.category != b.category {
			return a.category < b.category
		}
		return a.library < b.library
	})
	req := &pushv1.PushRequest{}
	for _, k := range keys {
		s := e.series[k]
		if s.enc.Len() == 0 { // every row's values were zero
			s.enc.Discard()
			continue
		}
		req.Series = append(req.Series, &pushv1.RawProfileSeries{
			Labels:  s.labels,
			Samples: []*pushv1.RawSample{{RawProfile: e.compress(s.enc, t, t.Sub(start))}},
		})
	}
	return req
}

// add returns the encoder of series k, of which row is a row this
// interval, whose processes' views are v.
func (e *Exporter) add(k seriesKey, row *snapshot.Row, v views) *pprof.Encoder {
	s := e.series[k]
	if s == nil {
		var enc *pprof.Encoder
		switch {
		case k.malloc:
			enc = pprof.NewMallocEncoder()
		case k.growth:
			enc = pprof.NewGrowthEncoder(row.Kind.View())
		default:
			enc = pprof.NewEncoder(true, row.Kind.View())
		}
		s = &series{enc: enc}
		e.series[k] = s
	}
	if s.seen != e.interval {
		s.seen = e.interval
		if k.malloc {
			s.labels = e.mallocLabels(row, v)
		} else {
			s.labels = e.labels(*row, k, v)
		}
	}
	return s.enc
}

// compress writes a series' profile of the interval, gzipped, with one
// gzip writer for all.
func (e *Exporter) compress(enc *pprof.Encoder, t time.Time, duration time.Duration) []byte {
	e.gz.Reset()
	if e.zw == nil {
		// The fastest level: a profile a series every interval on every
		// node, where gzip's default would cost three times the CPU for
		// a profile a fifth smaller.
		e.zw, _ = gzip.NewWriterLevel(&e.gz, gzip.BestSpeed)
	} else {
		e.zw.Reset(&e.gz)
	}
	enc.WriteTo(e.zw, t, duration) // to memory: does not fail
	e.zw.Close()
	return slices.Clone(e.gz.Bytes())
}

// service is a row's service_name.
func (e *Exporter) service(row *snapshot.Row) string {
	switch c := row.Container; {
	case e.cfg.Service != "":
		return e.cfg.Service
	case c.Namespace != "":
		return c.Namespace + "/" + c.Workload
	default:
		return row.Comm
	}
}

// mallocLabels are the labels of a process's Malloc series: Inspektor
// Gadget's names for its pod.
func (e *Exporter) mallocLabels(row *snapshot.Row, v views) []*typesv1.LabelPair {
	pairs := []*typesv1.LabelPair{
		{Name: LabelName, Value: MallocProfileName},
		{Name: LabelDelta, Value: "false"},
		{Name: LabelService, Value: e.service(row)},
		{Name: schema.PID, Value: strconv.FormatUint(uint64(row.PID), 10)},
		{Name: schema.Comm, Value: row.Comm},
	}
	pairs = v.appendDriverOff(pairs, row.PID)
	if e.cfg.Node != "" {
		pairs = append(pairs, &typesv1.LabelPair{Name: LabelNode, Value: e.cfg.Node})
	}
	c := row.Container
	for _, l := range []struct{ name, value string }{
		{LabelIGNamespace, c.Namespace}, {LabelIGPod, c.Pod}, {LabelIGContainer, c.Name},
	} {
		if l.value != "" {
			pairs = append(pairs, &typesv1.LabelPair{Name: l.name, Value: l.value})
		}
	}
	return validUTF8(pairs)
}

// labels are the labels of series k, of which row is a row; v are the
// interval's processes' views.
func (e *Exporter) labels(row snapshot.Row, k seriesKey, v views) []*typesv1.LabelPair {
	pairs := []*typesv1.LabelPair{
		{Name: LabelName, Value: ProfileName},
		{Name: LabelDelta, Value: "false"},
		{Name: LabelService, Value: e.service(&row)},
		{Name: schema.PID, Value: strconv.FormatUint(uint64(row.PID), 10)},
		{Name: schema.Comm, Value: row.Comm},
		{Name: schema.Kind, Value: row.Kind.String()},
		{Name: schema.GPU, Value: row.GPU()},
	}
	if row.Kind == memory.KindTensor {
		for _, t := range v.tensors {
			if t.PID == row.PID && t.Ended.IsZero() && !t.Since.IsZero() { // on: since when it holds
				pairs = append(pairs, &typesv1.LabelPair{Name: LabelTensorViewSince, Value: t.Since.UTC().Format(time.RFC3339)})
			}
		}
	}
	pairs = v.appendDriverOff(pairs, row.PID)
	for _, l := range []struct{ name, value string }{{LabelCategory, k.category}, {LabelLibrary, k.library}} {
		if l.value != "" {
			pairs = append(pairs, &typesv1.LabelPair{Name: l.name, Value: l.value})
		}
	}
	if e.cfg.Node != "" {
		pairs = append(pairs, &typesv1.LabelPair{Name: LabelNode, Value: e.cfg.Node})
	}
	c := row.Container
	for _, l := range []struct{ name, value string }{
		{schema.Namespace, c.Namespace}, {schema.Pod, c.Pod}, {schema.Container, c.Name},
		{schema.PodUID, c.PodUID}, {schema.ContainerID, c.ContainerID},
	} {
		if l.value != "" {
			pairs = append(pairs, &typesv1.LabelPair{Name: l.name, Value: l.value})
		}
	}
	return validUTF8(pairs)
}

// appendDriverOff labels a series of process pid if its driver view was
// switched off: partial from then on.
func (v views) appendDriverOff(pairs []*typesv1.LabelPair, pid uint32) []*typesv1.LabelPair {
	for _, off := range v.driverOff {
		if off.PID == pid {
			pairs = append(pairs, &typesv1.LabelPair{Name: LabelDriverViewOffSince, Value: off.Ended.UTC().Format(time.RFC3339)})
		}
	}
	return pairs
}

// validUTF8 has every label value valid UTF-8. A label is a protobuf
// string: gRPC cannot even send one that is not (a process name cut at 15
// bytes inside a character), and would fail the push every time it is
// tried.
func validUTF8(pairs []*typesv1.LabelPair) []*typesv1.LabelPair {
	for _, p := range pairs {
		p.Value = strings.ToValidUTF8(p.Value, "\uFFFD")
	}
	return pairs
}

// Backoff bounds between failed attempts.
const (
	firstBackoff = 500 * time.Millisecond
	maxBackoff   = 5 * time.Second
	pushTimeout  = 10 * time.Second
)

// maxAge is the age past which a queued interval is dropped unsent.
// Pyroscope refuses a profile older than -validation.reject-older-than, 1h
// by default (ValidateProfile's ingestion window, pkg/validation/validate.go),
// measured by its own clock when the push arrives. Five minutes inside that
// bound leave room for the node's clock running behind the server's and for
// a push in flight (pushTimeout) or waiting on its backoff.
const maxAge = 55 * time.Minute

// Run sends queued intervals in order until ctx is done. A push that may
// pass later is retried with exponential backoff; one the server refused
// for its content is dropped at once, and the next interval is sent.
func (e *Exporter) Run(ctx context.Context) {
	backoff := firstBackoff
	for {
		e.expire()
		p := e.head()
		if p == nil {
			select {
			case <-ctx.Done():
				return
			case <-e.ready:
				continue
			}
		}
		if err := e.push(ctx, p); err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = firstBackoff
	}
}

// Drain sends the queued intervals, as Run does, until none is left or ctx
// is done: an agent's last intervals, as it stops. Run must have returned.
func (e *Exporter) Drain(ctx context.Context) {
	for p := e.head(); p != nil; p = e.head() {
		if err := e.push(ctx, p); err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(firstBackoff):
			}
		}
	}
}

// expire drops, and counts, the queued intervals too old for the server:
// after an outage, what it would refuse is not sent.
func (e *Exporter) expire() {
	oldest := e.now().Round(0).Add(-maxAge)
	e.mu.Lock()
	defer e.mu.Unlock()
	kept := e.queue[:0]
	for _, p := range e.queue {
		if p.end.Before(oldest) {
			e.stats.Expired++
			continue
		}
		kept = append(kept, p)
	}
	clear(e.queue[len(kept):]) // let the dropped requests go
	e.queue = kept
}

func (e *Exporter) head() *pending {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.queue) == 0 {
		return nil
	}
	return e.queue[0]
}

// push sends p once. It returns an error only when p stays queued, to be
// sent again: delivered or refused, p leaves the queue.
func (e *Exporter) push(ctx context.Context, p *pending) error {
	// A server that takes the connection and never answers holds one
	// push no longer than this; the interval stays queued and is retried.
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	_, err := e.client.Push(ctx, p.req)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err == nil {
		e.pop(p)
		e.stats.Pushed++
		e.stats.LastError = ""
		return nil
	}
	v, reason := judge(err)
	if v == drop {
		e.pop(p)
		e.stats.Rejected++
		e.stats.RejectedBy[reason]++
		e.stats.LastRejection = describe(reason, err)
		e.stats.LastError = ""
		return nil
	}
	e.stats.Failed++
	e.stats.LastError = err.Error()
	return err
}

// pop removes p from the head of the queue, unless a full queue dropped it
// while it was sent.
func (e *Exporter) pop(p *pending) {
	if len(e.queue) > 0 && e.queue[0] == p {
		e.queue[0] = nil
		e.queue = e.queue[1:]
	}
}

// Stats returns the counts so far.
func (e *Exporter) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	s.RejectedBy = maps.Clone(e.stats.RejectedBy)
	s.Queued = len(e.queue)
	return s
}

// Close releases the connection.
func (e *Exporter) Close() error { return e.conn.Close() }
