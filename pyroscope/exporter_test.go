package pyroscope

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"maps"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/breakdown"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

type receiver = pyroscopetest.Receiver

func serve(t *testing.T, r *receiver, lis net.Listener, opts ...grpc.ServerOption) {
	pyroscopetest.Serve(t, r, lis, opts...)
}

func listen(t *testing.T) net.Listener {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

func row(pid uint32, stack accounting.StackID, kind memory.Kind, fn string, c accounting.Counters) snapshot.Row {
	return snapshot.Row{
		Key:      accounting.Key{PID: pid, Stack: stack, Kind: kind},
		Comm:     "train",
		Frames:   []*symbolize.Frame{{Function: "cuMemAlloc_v2"}, {Function: fn, File: "train.py", Line: 7}},
		Counters: c,
	}
}

func start(t *testing.T, cfg Config) *Exporter {
	t.Helper()
	return startWithClock(t, cfg, time.Now)
}

// startWithClock starts an exporter whose queue ages by now.
func startWithClock(t *testing.T, cfg Config, now func() time.Time) *Exporter {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.now = now
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; e.Close() })
	return e
}

func TestPushesAllocatedPerIntervalAndLive(t *testing.T) {
	lis := listen(t)
	r := &receiver{}
	serve(t, r, lis)
	e := start(t, Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 4, Node: "gpu-node-1"})

	t0 := time.Now()
	e.Export(snapshot.Snapshot{Time: t0}.With([]snapshot.Row{
		row(10, 1, memory.KindDevice, "load_weights", accounting.Counters{AllocBytes: 100, AllocCount: 1}),
		row(10, 2, memory.KindHost, "pin", accounting.Counters{AllocBytes: 8, AllocCount: 1}),
	}...))
	// In the second interval load_weights allocates 50 more and frees 100.
	e.Export(snapshot.Snapshot{Time: t0.Add(time.Second)}.With([]snapshot.Row{
		row(10, 1, memory.KindDevice, "load_weights", accounting.Counters{AllocBytes: 150, AllocCount: 2, FreeBytes: 100, FreeCount: 1}),
		row(10, 2, memory.KindHost, "pin", accounting.Counters{AllocBytes: 8, AllocCount: 1}),
	}...))
	waitfor.Condition(t, "two pushes", time.Minute, func() bool { return len(r.Received()) == 2 })

	second := r.Received()[1]
	if len(second.Series) != 2 {
		t.Fatalf("%d series, want one per kind", len(second.Series))
	}
	device := second.Series[0]
	want := map[string]string{
		"__name__": "memory", "__delta__": "false", "service_name": "train", "pid": "10",
		"comm": "train", "kind": "device", "node": "gpu-node-1", "gpu": "0",
	}
	if got := pyroscopetest.Labels(device); len(got) != len(want) {
		t.Errorf("labels %v, want %v", got, want)
	} else {
		for k, v := range want {
			if got[k] != v {
				t.Errorf("label %s=%q, want %q", k, got[k], v)
			}
		}
	}
	p, err := profile.ParseData(device.Samples[0].RawProfile)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Sample) != 1 || p.SampleType[1].Type != "alloc_space" || p.SampleType[3].Type != "inuse_space" {
		t.Fatalf("profile %v", p)
	}
	if got := p.Sample[0].Value; got[0] != 1 || got[1] != 50 || got[2] != 1 || got[3] != 50 {
		t.Errorf("values %v, want [1 50 1 50]: allocated in the interval, live at its end", got)
	}
	if p.DurationNanos != time.Second.Nanoseconds() {
		t.Errorf("duration %d", p.DurationNanos)
	}
	// The host series: nothing allocated in the interval, 8 bytes live.
	hp, _ := profile.ParseData(second.Series[1].Samples[0].RawProfile)
	if got := hp.Sample[0].Value; got[1] != 0 || got[3] != 8 {
		t.Errorf("host values %v", got)
	}
	if s := e.Stats(); s.Pushed != 2 || s.Failed != 0 || s.Dropped != 0 || s.Queued != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestCredentialsAndTenant(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		auth string
		ok   bool
	}{
		{"basic", Config{User: "gpu", Password: "s3cret", TenantID: "team-a"}, "Basic Z3B1OnMzY3JldA==", true},
		{"bearer", Config{Token: "tok3n"}, "Bearer tok3n", true},
		{"wrong password", Config{User: "gpu", Password: "wrong-s3cret"}, "Basic Z3B1OnMzY3JldA==", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis := listen(t)
			r := &receiver{Auth: tc.auth}
			serve(t, r, lis)
			cfg := tc.cfg
			cfg.URL, cfg.Interval, cfg.QueueSize = "http://"+lis.Addr().String(), time.Second, 2
			e := start(t, cfg)
			e.Export(snapshot.Snapshot{Time: time.Now()}.With([]snapshot.Row{row(1, 1, memory.KindDevice, "f", accounting.Counters{AllocBytes: 1, AllocCount: 1})}...))
			if tc.ok {
				waitfor.Condition(t, "a push", time.Minute, func() bool { return len(r.Received()) == 1 })
				if cfg.TenantID != "" && r.Metadata()[0]["x-scope-orgid"][0] != "team-a" {
					t.Errorf("tenant %v", r.Metadata()[0])
				}
				return
			}
			waitfor.Condition(t, "a failure", time.Minute, func() bool { return e.Stats().Failed > 0 })
			s := e.Stats()
			if !strings.Contains(s.LastError, "Unauthenticated") || strings.Contains(s.LastError, "s3cret") || s.Queued != 1 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// selfSigned writes a certificate for 127.0.0.1 and returns the server's TLS
// config and the CA file.
func selfSigned(t *testing.T) (*tls.Config, string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pyroscope"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, caFile
}

func TestTLS(t *testing.T) {
	serverTLS, caFile := selfSigned(t)
	tlsLis, plainLis := listen(t), listen(t)
	tlsRecv, plainRecv := &receiver{}, &receiver{}
	serve(t, tlsRecv, tlsLis, grpc.Creds(credentials.NewTLS(serverTLS)))
	serve(t, plainRecv, plainLis)
	report := snapshot.Snapshot{Time: time.Now()}.With([]snapshot.Row{row(1, 1, memory.KindDevice, "f", accounting.Counters{AllocBytes: 1, AllocCount: 1})}...)

	ok := start(t, Config{URL: "https://" + tlsLis.Addr().String(), CAFile: caFile, Interval: time.Second, QueueSize: 2})
	ok.Export(report)
	waitfor.Condition(t, "a TLS push", time.Minute, func() bool { return len(tlsRecv.Received()) == 1 })

	for name, cfg := range map[string]Config{
		"untrusted certificate": {URL: "https://" + tlsLis.Addr().String()},
		"TLS to cleartext":      {URL: "https://" + plainLis.Addr().String(), CAFile: caFile},
		"cleartext to TLS":      {URL: "http://" + tlsLis.Addr().String()},
	} {
		cfg.Interval, cfg.QueueSize = time.Second, 2
		e := start(t, cfg)
		e.Export(report)
		waitfor.Condition(t, name+" failing", time.Minute, func() bool { return e.Stats().Failed > 0 })
		if s := e.Stats(); s.Pushed != 0 || s.LastError == "" {
			t.Errorf("%s: %+v", name, s)
		}
	}
	if len(plainRecv.Received()) != 0 {
		t.Error("cleartext receiver got a push over TLS")
	}
}

func TestBadConfiguration(t *testing.T) {
	for _, cfg := range []Config{
		{URL: ""},
		{URL: "localhost:4040"},
		{URL: "ftp://localhost:4040"},
		{URL: "http://localhost:4040/pyroscope"},
		{URL: "http://localhost:4040", CAFile: "/ca.pem"},
		{URL: "https://localhost:4040", CAFile: "/nonexistent/ca.pem"},
		{URL: "http://localhost:4040", QueueSize: 0},
	} {
		if cfg.QueueSize == 0 && cfg.URL != "http://localhost:4040" {
			cfg.QueueSize = 1
		}
		cfg.Interval = time.Second
		if _, err := New(cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}

// TestReceiverDownThenUp: while 30 intervals are exported nothing listens;
// pushes fail, intervals queue, and the oldest are dropped and counted once
// the queue is full. Then the receiver comes up on the same address and gets
// every queued interval, in order.
func TestReceiverDownThenUp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		queue int
	}{{"queue holds all", 64}, {"queue overflows", 8}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lis := listen(t)
			addr := lis.Addr().String()
			lis.Close()
			e := start(t, Config{URL: "http://" + addr, Interval: time.Second, QueueSize: tc.queue})

			const intervals = 30
			t0 := time.Now()
			for i := range intervals {
				e.Export(snapshot.Snapshot{Time: t0.Add(time.Duration(i+1) * time.Second)}.With([]snapshot.Row{
					row(1, 1, memory.KindDevice, "f", accounting.Counters{AllocBytes: uint64(i + 1), AllocCount: uint64(i + 1)}),
				}...))
			}
			// While the server is down, pushes fail and are retried: no
			// interval is lost but to the queue's bound.
			waitfor.Condition(t, "a push to fail", time.Minute, func() bool { return e.Stats().Failed > 0 })
			down := e.Stats()
			if down.Pushed != 0 || down.Failed == 0 || down.LastError == "" {
				t.Errorf("while down: %+v", down)
			}

			lis, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			r := &receiver{}
			serve(t, r, lis)
			kept := min(intervals, tc.queue)
			waitfor.Condition(t, "the queue to drain", time.Minute, func() bool { return len(r.Received()) == kept })
			s := e.Stats()
			if s.Pushed != uint64(kept) || s.Dropped != uint64(intervals-kept) || s.Queued != 0 {
				t.Errorf("after: %+v, want %d pushed and %d dropped", s, kept, intervals-kept)
			}
			var last int64
			for _, req := range r.Received() {
				p, err := profile.ParseData(req.Series[0].Samples[0].RawProfile)
				if err != nil {
					t.Fatal(err)
				}
				if p.TimeNanos <= last {
					t.Errorf("intervals out of order")
				}
				last = p.TimeNanos
			}
		})
	}
}

// TestTensorViewHasItsOwnProfileTypes: a process's driver rows and tensor
// rows go to series of their own, the tensor series with the tensor_*
// sample types, so that Pyroscope's memory:inuse_space (any label) is the
// driver view alone and memory:tensor_inuse_space the tensor view alone;
// likewise the interval's peaks, memory:peak_space and
// memory:tensor_peak_space, with the share of a stack freed before the
// interval's end.
func TestTensorViewHasItsOwnProfileTypes(t *testing.T) {
	lis := listen(t)
	r := &receiver{}
	serve(t, r, lis)
	e := start(t, Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 4})
	rows := []snapshot.Row{
		// The allocator's 20 MiB segment, the 12 MiB tensor inside it, a
		// pinned buffer, and a 30 MiB spike freed since.
		row(10, 1, memory.KindDevice, "load_weights", accounting.Counters{AllocBytes: 20 << 20, AllocCount: 1}),
		row(10, 2, memory.KindTensor, "load_weights", accounting.Counters{AllocBytes: 16 << 20, AllocCount: 2, FreeBytes: 4 << 20, FreeCount: 1}),
		row(10, 3, memory.KindHost, "pin", accounting.Counters{AllocBytes: 4096, AllocCount: 1}),
		row(10, 4, memory.KindDevice, "forward_activation", accounting.Counters{AllocBytes: 30 << 20, AllocCount: 3, FreeBytes: 30 << 20, FreeCount: 3}),
	}
	share := func(r snapshot.Row, bytes, count uint64) accounting.PeakRow {
		return accounting.PeakRow{Key: r.Key, Amount: accounting.Amount{Bytes: bytes, Count: count}}
	}
	peaks := []snapshot.Peak{
		{PID: 10, GPU: "0", View: memory.ViewDriver, Amount: accounting.Amount{Bytes: 50 << 20, Count: 4},
			Shares: []accounting.PeakRow{share(rows[3], 30<<20, 3), share(rows[0], 20<<20, 1)}},
		{PID: 10, GPU: "host", View: memory.ViewDriver, Amount: accounting.Amount{Bytes: 4096, Count: 1}, Shares: []accounting.PeakRow{share(rows[2], 4096, 1)}},
		{PID: 10, GPU: "0", View: memory.ViewTensor, Amount: accounting.Amount{Bytes: 16 << 20, Count: 2}, Shares: []accounting.PeakRow{share(rows[1], 16<<20, 2)}},
	}
	e.Export(snapshot.Snapshot{Time: time.Now(), Peaks: peaks}.With(rows...))
	waitfor.Condition(t, "a push", time.Minute, func() bool { return len(r.Received()) == 1 })
	push := r.Received()[0]
	types := map[string][]string{} // by kind
	for _, s := range push.Series {
		p, kind := parseRaw(t, s), pyroscopetest.Labels(s)[schema.Kind]
		for _, st := range p.SampleType {
			types[kind] = append(types[kind], pyroscopetest.ProfileTypeID(s, p, st))
		}
		if kind == "tensor" && p.DefaultSampleType != "tensor_inuse_space" {
			t.Errorf("tensor series' default sample type %q", p.DefaultSampleType)
		}
	}
	driver := "memory:alloc_objects:count:space:bytes memory:alloc_space:bytes:space:bytes memory:inuse_objects:count:space:bytes memory:inuse_space:bytes:space:bytes " +
		"memory:peak_objects:count:space:bytes memory:peak_space:bytes:space:bytes"
	tensor := "memory:tensor_alloc_objects:count:space:bytes memory:tensor_alloc_space:bytes:space:bytes memory:tensor_inuse_objects:count:space:bytes memory:tensor_inuse_space:bytes:space:bytes " +
		"memory:tensor_peak_objects:count:space:bytes memory:tensor_peak_space:bytes:space:bytes"
	for kind, want := range map[string]string{"device": driver, "host-pinned": driver, "tensor": tensor} {
		if got := strings.Join(types[kind], " "); got != want {
			t.Errorf("%s series' profile types %s, want %s", kind, got, want)
		}
	}
	totals, err := pyroscopetest.Totals(push)
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]int64{
		"memory:inuse_space:bytes:space:bytes":        20<<20 + 4096,
		"memory:tensor_inuse_space:bytes:space:bytes": 12 << 20,
		"memory:tensor_alloc_space:bytes:space:bytes": 16 << 20,
		"memory:inuse_objects:count:space:bytes":      2,
		// Two peaks, on GPU 0 and on the host: a query of one process's
		// GPU is its peak there.
		"memory:peak_space:bytes:space:bytes":        50<<20 + 4096,
		"memory:peak_objects:count:space:bytes":      5,
		"memory:tensor_peak_space:bytes:space:bytes": 16 << 20,
	} {
		if totals[id] != want {
			t.Errorf("%s: %d with no label filter, want %d", id, totals[id], want)
		}
	}
	if refused := r.Refused(); len(refused) != 0 {
		t.Errorf("refused: %v", refused)
	}
}

func parseRaw(t *testing.T, s *pushv1.RawProfileSeries) *profile.Profile {
	t.Helper()
	p, err := profile.ParseData(s.Samples[0].RawProfile)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMallocSeries: with Config.Malloc, each process also has the series
// Inspektor Gadget's GPU observability dashboard reads: process_cpu,
// labelled with IG's pod names, one sample type (malloc, bytes) and no
// period type, holding the bytes allocated on the GPUs in each interval,
// as the dashboard's Prometheus panels count them (host_raw="0"): pinned
// host memory, NVML's contexts and the tensor view left out; an interval in
// which the process allocated nothing has none.
func TestMallocSeries(t *testing.T) {
	lis := listen(t)
	r := &receiver{}
	serve(t, r, lis)
	e := start(t, Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 4, Malloc: true})
	pod := container.Identity{Namespace: "ml", Pod: "vllm-0", Name: "server", Workload: "vllm"}
	inPod := func(row snapshot.Row) snapshot.Row { row.Container = pod; return row }
	t0 := time.Now()
	for i, allocated := range []uint64{1 << 30, 1 << 30, 1<<30 + 4096} {
		e.Export(snapshot.Snapshot{Time: t0.Add(time.Duration(i) * time.Second)}.With(
			inPod(row(10, 1, memory.KindDevice, "_allocate_kv_cache_tensors", accounting.Counters{AllocBytes: allocated, AllocCount: 1})),
			inPod(row(10, 2, memory.KindHost, "pin", accounting.Counters{AllocBytes: 8, AllocCount: 1})),
			inPod(row(10, 4, memory.KindContext, "cuDevicePrimaryCtxRetain", accounting.Counters{AllocBytes: 518 << 20, AllocCount: 1})),
			inPod(row(10, 3, memory.KindTensor, "forward", accounting.Counters{AllocBytes: uint64(i+1) << 20, AllocCount: 1})),
		))
	}
	waitfor.Condition(t, "three pushes", time.Minute, func() bool { return len(r.Received()) == 3 })
	for i, want := range []map[string]int64{
		{"_allocate_kv_cache_tensors": 1 << 30},
		nil, // nothing allocated
		{"_allocate_kv_cache_tensors": 4096},
	} {
		var malloc []*pushv1.RawProfileSeries
		for _, s := range r.Received()[i].Series {
			if pyroscopetest.Labels(s)["__name__"] == MallocProfileName {
				malloc = append(malloc, s)
			}
		}
		if want == nil {
			if len(malloc) != 0 {
				t.Errorf("interval %d: %d malloc series, want none", i, len(malloc))
			}
			continue
		}
		if len(malloc) != 1 {
			t.Fatalf("interval %d: %d malloc series, want one for the process", i, len(malloc))
		}
		labels := pyroscopetest.Labels(malloc[0])
		wantLabels := map[string]string{"__name__": "process_cpu", "__delta__": "false", "service_name": "ml/vllm", "pid": "10", "comm": "train",
			LabelIGNamespace: "ml", LabelIGPod: "vllm-0", LabelIGContainer: "server"}
		if !maps.Equal(labels, wantLabels) {
			t.Errorf("interval %d: labels %v, want %v", i, labels, wantLabels)
		}
		p, err := profile.ParseData(malloc[0].Samples[0].RawProfile)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.SampleType) != 1 || pprofTypeID(p) != MallocProfileTypeID {
			t.Fatalf("interval %d: profile type %s", i, pprofTypeID(p))
		}
		got := map[string]int64{}
		for _, s := range p.Sample {
			got[s.Location[1].Line[0].Function.Name] += s.Value[0]
		}
		if !maps.Equal(got, want) {
			t.Errorf("interval %d: %v, want %v", i, got, want)
		}
	}
}

// pprofTypeID is the profile type Pyroscope files a one-type profile under,
// from its sample and period types.
func pprofTypeID(p *profile.Profile) string {
	period := ":"
	if p.PeriodType != nil {
		period = p.PeriodType.Type + ":" + p.PeriodType.Unit
	}
	return MallocProfileName + ":" + p.SampleType[0].Type + ":" + p.SampleType[0].Unit + ":" + period
}

// TestDriverViewOffLabelsTheProcess: every series of a process whose
// driver view its budget switched off says since when; another process's
// do not.
func TestDriverViewOffLabelsTheProcess(t *testing.T) {
	lis := listen(t)
	r := &receiver{}
	serve(t, r, lis)
	e := start(t, Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 4})
	ended := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	s := snapshot.Snapshot{Time: time.Now(), Counts: snapshot.Counts{DriverViewsOff: []snapshot.DriverViewOff{{PID: 10, Ended: ended, Why: "over budget"}}}}
	e.Export(s.With([]snapshot.Row{
		row(10, 1, memory.KindDevice, "load_weights", accounting.Counters{AllocBytes: 100, AllocCount: 1, ImplicitFreeBytes: 100, ImplicitFreeCount: 1}),
		row(10, 2, memory.KindTensor, "forward", accounting.Counters{AllocBytes: 8, AllocCount: 1}),
		row(11, 3, memory.KindDevice, "load_weights", accounting.Counters{AllocBytes: 4, AllocCount: 1}),
	}...))
	waitfor.Condition(t, "a push", time.Minute, func() bool { return len(r.Received()) == 1 })
	labelled := map[string]string{}
	for _, series := range r.Received()[0].Series {
		l := pyroscopetest.Labels(series)
		if l[LabelName] == ProfileName {
			labelled[l["pid"]+" "+l["kind"]] = l[LabelDriverViewOffSince]
		}
	}
	want := map[string]string{"10 device": "2026-12-03T08:00:00Z", "10 tensor": "2026-12-03T08:00:00Z", "11 device": ""}
	if !maps.Equal(labelled, want) {
		t.Errorf("%s by series %v, want %v", LabelDriverViewOffSince, labelled, want)
	}
}

// TestCategoryLabels: with Categories, a process's series of one kind is
// split by the breakdown's category of its stacks, each labelled with it;
// memory of no category (the host's) has no label. The bytes are those of
// their rows.
func TestCategoryLabels(t *testing.T) {
	lis := listen(t)
	r := &receiver{}
	serve(t, r, lis)
	e := start(t, Config{URL: "http://" + lis.Addr().String(), Interval: time.Second, QueueSize: 4, Categories: breakdown.Default()})
	e.Export(snapshot.Snapshot{Time: time.Now()}.With([]snapshot.Row{
		row(10, 1, memory.KindTensor, "Linear.reset_parameters", accounting.Counters{AllocBytes: 100, AllocCount: 1}),
		row(10, 2, memory.KindTensor, "forward", accounting.Counters{AllocBytes: 30, AllocCount: 1}),
		row(10, 3, memory.KindTensor, "forward_again", accounting.Counters{AllocBytes: 12, AllocCount: 1}),
		row(10, 4, memory.KindDevice, "load", accounting.Counters{AllocBytes: 7, AllocCount: 1}),
		row(10, 5, memory.KindHost, "pin", accounting.Counters{AllocBytes: 8, AllocCount: 1}),
	}...))
	waitfor.Condition(t, "a push", time.Minute, func() bool { return len(r.Received()) == 1 })
	got := map[string]int64{}
	for _, s := range r.Received()[0].Series {
		labels := pyroscopetest.Labels(s)
		p, err := profile.ParseData(s.Samples[0].RawProfile)
		if err != nil {
			t.Fatal(err)
		}
		for _, sample := range p.Sample {
			got[labels["kind"]+"/"+labels["category"]] += sample.Value[3]
		}
	}
	want := map[string]int64{"tensor/parameters": 100, "tensor/activations": 42, "device/other_driver": 7, "host-pinned/": 8}
	if !maps.Equal(got, want) {
		t.Errorf("live bytes by kind and category %v, want %v", got, want)
	}
}
