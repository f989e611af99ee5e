package main

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/gpu-mem/gpu-mem/breakdown"
	"github.com/gpu-mem/gpu-mem/budget"
	"github.com/gpu-mem/gpu-mem/control"
	"github.com/gpu-mem/gpu-mem/growth"
	"github.com/gpu-mem/gpu-mem/kube"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/metrics"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/pyroscope"
	"github.com/gpu-mem/gpu-mem/report"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// defaultPairCost is what a tensor allocation and its free cost the thread
// making them with the tensor view on, measured on an H200 through the
// agent (bench/gpu/model.sh, BENCHMARKS.md): the two traps and the programs.
const defaultPairCost = 4 * time.Microsecond

// defaultDriverPairCost is what a driver allocation and its free cost a
// real model with the driver view on, measured on an H200 where every
// tensor reaches the driver (bench/gpu/model.sh with the caching allocator
// off, BENCHMARKS.md): a training step of the Llama took 29 us more a
// pair, decoding 6.5 us, a torch.empty + del loop 5.6 us. The largest, so
// that no process pays more than the budget.
const defaultDriverPairCost = 30 * time.Microsecond

// defaultStatusInterval paces the status line: the Pyroscope push's
// default interval, whatever --pyroscope-interval says.
const defaultStatusInterval = 15 * time.Second

type agentOptions struct {
	target         targetFlags
	metricsAddr    string
	igMetrics      bool
	kubeconfig     string
	nodeName       string // also the profiles' node label
	interval       time.Duration
	statusInterval time.Duration
	budgetWindow   time.Duration
	duration       time.Duration
	pyroscope      pyroscope.Config
	passwordFile   string
	tokenFile      string
	tensorPIDs     []int
	tensorBudget   budget.Budget
	driverBudget   budget.Budget
	control        string               // the control socket's path
	growth         growth.Detector      // the rows growing, interval after interval
	last           metrics.LastInterval // the last interval's peaks, breakdown and growth, for the gauges
	snapshot       snapshot.Snapshot    // the last interval's, its memory reused
	exitsBefore    uint64               // the interval before's Exits: dropped at this one's end
	pushes         pyroscope.StatusLine
}

func newAgentCommand() *cobra.Command {
	o := &agentOptions{}
	cmd := &cobra.Command{
		Use:   "agent [flags]",
		Short: "Trace every process using the CUDA driver and export until stopped",
		Long: `Agent is the always-on mode for hosts and DaemonSets. It traces every process
that uses the CUDA driver, logs a status line every --status-interval and,
every interval (--pyroscope-interval), with --pyroscope-url, pushes one
profile per process and memory kind to Grafana Pyroscope: the bytes
allocated during the interval, the bytes live at its end, and what held the
memory at the interval's peak (the most each process held at once on a GPU,
per view; also the gauges gpumem_peak_bytes and gpumem_tensor_peak_bytes).
Pushes go through a bounded queue, retried with backoff; when the queue is
full the oldest interval is dropped and counted. An interval without any
process is not pushed; a push the server refuses for its content (gRPC
InvalidArgument, FailedPrecondition, OutOfRange; HTTP 400, 413, 422) is
dropped at once and counted as rejected, with its reason logged once; an
interval older than the server accepts (55 minutes, inside Pyroscope's
default hour) is dropped unsent and counted as expired. Tracing never waits
for the server.

Credentials are read from files or the environment (GPUMEM_PYROSCOPE_PASSWORD,
GPUMEM_PYROSCOPE_TOKEN) and never logged.

Each on-demand tensor view and each process's driver view is measured over
--budget-window against its budget (--tensor-budget, --driver-budget) and
switched off past it.`,
		Example: `  gpumem agent --pyroscope-url http://pyroscope:4040
  gpumem agent --pyroscope-url https://profiles.example.com --pyroscope-user 1234 \
      --pyroscope-password-file /etc/gpumem/password --pyroscope-tenant team-a`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	o.target.register(fs, profiler.TensorsOnDemand)
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (default: until stopped)")
	fs.DurationVar(&o.statusInterval, "status-interval", defaultStatusInterval, "log one status line this often (processes, events, losses, symbol tables, pushes)")
	fs.IntSliceVar(&o.tensorPIDs, "tensor-pid", nil, "switch the tensor view of these processes on from the start (--tensors=on-demand)")
	fs.StringVar(&o.control, "control-socket", control.DefaultSocket, "serve the control socket of gpumem tensors here, for root alone (--tensors=on-demand); empty: none")

	fs.DurationVar(&o.interval, "pyroscope-interval", pyroscope.DefaultInterval, "push interval, and the interval whose peaks the peak gauges show")
	fs.StringVar(&o.pyroscope.URL, "pyroscope-url", "", "Pyroscope server, http://HOST:PORT (cleartext HTTP/2) or https://HOST:PORT; none: no push")
	fs.IntVar(&o.pyroscope.QueueSize, "pyroscope-queue", 20, "intervals kept while the server is unreachable")
	fs.StringVar(&o.pyroscope.Service, "service-name", "", "service_name label (default: the process name)")
	fs.StringVar(&o.pyroscope.CAFile, "pyroscope-ca-file", "", "PEM certificates to trust for an https:// server")
	fs.StringVar(&o.pyroscope.User, "pyroscope-user", "", "basic auth user")
	fs.StringVar(&o.passwordFile, "pyroscope-password-file", "", "file holding the basic auth password (or GPUMEM_PYROSCOPE_PASSWORD)")
	fs.StringVar(&o.tokenFile, "pyroscope-token-file", "", "file holding a bearer token (or GPUMEM_PYROSCOPE_TOKEN)")
	fs.StringVar(&o.pyroscope.TenantID, "pyroscope-tenant", "", "tenant, sent as X-Scope-OrgID")
	fs.BoolVar(&o.pyroscope.Malloc, "gpu-observability-profiles", true, "also push, per process, the profile Inspektor Gadget's GPU observability dashboard reads "+
		"(process_cpu:malloc:bytes: the driver view's bytes allocated each interval, labelled k8s_namespace and k8s_podName)")
	groupFlags(fs, "Pyroscope", "pyroscope-interval", "pyroscope-url", "pyroscope-queue", "service-name", "pyroscope-ca-file", "pyroscope-user",
		"pyroscope-password-file", "pyroscope-token-file", "pyroscope-tenant", "gpu-observability-profiles")

	fs.StringVar(&o.metricsAddr, "metrics-address", "", "serve Prometheus metrics at http://ADDR/metrics, e.g. :9464")
	fs.BoolVar(&o.igMetrics, "gpu-observability-metrics", true, "serve, with the metrics, those Inspektor Gadget's GPU observability dashboard queries "+
		"(mem_alloc_bytes_total, mem_free_bytes_total, mem_implicit_free_bytes_total: the driver view per process)")
	groupFlags(fs, "Prometheus metrics", "metrics-address", "gpu-observability-metrics")

	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "name pods from this API server (default: the in-cluster one, if any)")
	fs.StringVar(&o.nodeName, "node-name", "", "this node: the pods watched, and the node label of the profiles (default: $NODE_NAME, else the host name)")
	// --node was the profiles' node label alone: now --node-name's, which
	// Inspektor Gadget's k8smeta operator names so too.
	fs.StringVar(&o.nodeName, "node", "", "")
	_ = fs.MarkDeprecated("node", "use --node-name")
	groupFlags(fs, "Kubernetes", "kubeconfig", "node-name")

	fs.Float64Var(&o.tensorBudget.Share, "tensor-budget", 0.02, "switch a process's on-demand tensor view off when it costs more than this share of the process's time (0: never)")
	fs.Float64Var(&o.driverBudget.Share, "driver-budget", 0.02, "switch a process's driver view off when it costs more than this share of the process's time, "+
		"as where every tensor reaches the driver (PyTorch without its cache, JAX's platform allocator) (0: never)")
	fs.DurationVar(&o.budgetWindow, "budget-window", budget.DefaultWindow, "measure each view's cost over windows this long: a view over its budget is switched off at the end of one")
	groupFlags(fs, "Budget", "tensor-budget", "driver-budget", "budget-window")
	registerGrowthIntervals(fs, &o.growth)
	groupFlags(fs, "Growth", "growth-intervals")
	// What a view costs a pair of calls is the budgets' calibration,
	// measured on an H200 (BENCHMARKS.md), not a choice: hidden, kept for
	// measuring another machine.
	fs.DurationVar(&o.tensorBudget.PairCost, "tensor-pair-cost", defaultPairCost, "what one tensor allocation and its free cost their thread with the tensor view on, for --tensor-budget")
	fs.DurationVar(&o.driverBudget.PairCost, "driver-pair-cost", defaultDriverPairCost, "what one driver allocation and its free cost their thread with the driver view on, for --driver-budget")
	_ = fs.MarkHidden("tensor-pair-cost")
	_ = fs.MarkHidden("driver-pair-cost")
	groupUsage(cmd)
	return cmd
}

// defaultNode fills in --node-name, whose default is this host's: resolved
// here, not as the flag's default, which the generated reference
// (docs/reference/cli) would print as the generating machine's.
func (o *agentOptions) defaultNode() {
	host, _ := os.Hostname()
	o.nodeName = cmp.Or(o.nodeName, os.Getenv("NODE_NAME"), host)
	o.pyroscope.Node = o.nodeName
}

// secret reads a credential from a file, else from the environment.
func secret(file, env string) (string, error) {
	if file == "" {
		return os.Getenv(env), nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read credential: %w", err)
	}
	return strings.TrimRight(string(data), "\r\n"), nil
}

func (o *agentOptions) exporter() (*pyroscope.Exporter, error) {
	if o.pyroscope.URL == "" {
		return nil, nil
	}
	var err error
	if o.pyroscope.Password, err = secret(o.passwordFile, "GPUMEM_PYROSCOPE_PASSWORD"); err != nil {
		return nil, usageError{err}
	}
	if o.pyroscope.Token, err = secret(o.tokenFile, "GPUMEM_PYROSCOPE_TOKEN"); err != nil {
		return nil, usageError{err}
	}
	o.pyroscope.Interval = o.interval
	o.pyroscope.Categories = o.target.rules.get() // a category label on every series
	e, err := pyroscope.New(o.pyroscope)
	if err != nil {
		return nil, usageError{err}
	}
	return e, nil
}

// Without GOMEMLIMIT, the agent bounds its Go heap itself, so that a
// DaemonSet's memory does not grow with idle garbage: below the container's
// limit, which the chart passes as GPUMEM_MEMORY_LIMIT (bytes), by what
// lives outside the heap (the ring buffer, mapped twice, thread stacks,
// the pages of the symbol files read); 128 MiB without one.
const (
	defaultMemoryLimit = 128 << 20
	offHeapReserve     = 64 << 20
	minMemoryLimit     = 64 << 20
)

// memoryLimit is the soft limit on the Go heap.
func memoryLimit() (int64, error) {
	v := os.Getenv("GPUMEM_MEMORY_LIMIT")
	if v == "" {
		return defaultMemoryLimit, nil
	}
	limit, err := strconv.ParseInt(v, 10, 64)
	if err != nil || limit <= 0 {
		return 0, fmt.Errorf("GPUMEM_MEMORY_LIMIT=%q: want the container's memory limit in bytes", v)
	}
	return max(limit-offHeapReserve, minMemoryLimit), nil
}

func (o *agentOptions) run(ctx context.Context) error {
	if os.Getenv("GOMEMLIMIT") == "" {
		limit, err := memoryLimit()
		if err != nil {
			return usageError{err}
		}
		debug.SetMemoryLimit(limit)
	}
	for _, d := range []struct {
		flag string
		d    time.Duration
	}{{"--pyroscope-interval", o.interval}, {"--status-interval", o.statusInterval}, {"--budget-window", o.budgetWindow}} {
		if d.d <= 0 {
			return usageError{fmt.Errorf("%s must be positive", d.flag)}
		}
	}
	if err := checkGrowthIntervals(o.growth); err != nil {
		return usageError{err}
	}
	o.defaultNode()
	exp, err := o.exporter()
	if err != nil {
		return err
	}
	ctx, stop := untilStopped(ctx, o.duration)
	defer stop()
	cfg := o.target.config()
	o.tensorBudget.Window, o.driverBudget.Window = o.budgetWindow, o.budgetWindow
	cfg.TensorPIDs, cfg.TensorBudget, cfg.DriverBudget = o.tensorPIDs, o.tensorBudget, o.driverBudget
	cfg.OnOOM = func(oom snapshot.OOM) { // the status line at an out-of-memory, its verdict first
		oom.Verdict = breakdown.Judge(&oom, o.target.rules.get())
		logf("%s", report.DescribeOOM(oom))
	}
	if len(cfg.TensorPIDs) > 0 && cfg.Tensors != profiler.TensorsOnDemand {
		return usageError{fmt.Errorf("--tensor-pid needs --tensors=on-demand")}
	}
	pods, err := o.watchPods(ctx)
	if err != nil {
		return err
	}
	if pods != nil { // a nil *kube.Pods in an interface is not a nil interface
		cfg.Pods, cfg.TensorAsks = pods, pods
	}
	p, err := profiler.New(cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	if o.control != "" && cfg.Tensors == profiler.TensorsOnDemand {
		// Without it, pods' annotations and --tensor-pid still work.
		if err := control.Serve(ctx, o.control, p); err != nil {
			logf("%v: gpumem tensors cannot reach this agent", err)
		} else {
			logs.Event(log, logs.ControlSocket, fmt.Sprintf("control socket at %s: gpumem tensors on PID switches a process's tensor view on", o.control),
				"path", o.control)
		}
	}
	pushing := make(chan struct{}) // closed once exp.Run returned
	if exp != nil {
		defer exp.Close()
		go func() {
			exp.Run(ctx)
			close(pushing)
		}()
		logf("exporting to %s every %v", o.pyroscope.URL, o.interval)
	}
	if o.metricsAddr != "" {
		if err := serveMetrics(ctx, o.metricsAddr, metrics.Collector{Source: p, Peaks: &o.last, Breakdown: &o.last, Growth: &o.last,
			Node: o.nodeName, GPUObservability: o.igMetrics}, exp); err != nil {
			return err
		}
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	interval := time.NewTicker(o.interval)
	defer interval.Stop()
	status := time.NewTicker(o.statusInterval)
	defer status.Stop()
	for {
		select {
		case err := <-done:
			if exp != nil {
				<-pushing
				o.pushLast(p, exp)
			}
			return err
		case <-interval.C:
			o.export(p, exp)
		case <-status.C:
			o.status(p, exp)
		}
	}
}

// lastPushTimeout bounds the last push of a stopping agent, well inside the
// chart's grace period (terminationGracePeriodSeconds: 30).
const lastPushTimeout = 10 * time.Second

// pushLast ends the last interval, the events read before the stop, and
// pushes it with those still queued: what the process allocated then is in
// Pyroscope, not lost at a restart (the next agent continues from it).
func (o *agentOptions) pushLast(p *profiler.Profiler, exp *pyroscope.Exporter) {
	o.export(p, exp)
	ctx, cancel := context.WithTimeout(context.Background(), lastPushTimeout)
	defer cancel()
	exp.Drain(ctx)
	if q := exp.Stats().Queued; q > 0 {
		logf("stopping with %d intervals not pushed: %s unreachable", q, o.pyroscope.URL)
	}
}

// status logs the status line. It needs the totals per process alone: it
// never waits for symbols.
func (o *agentOptions) status(p *profiler.Profiler, exp *pyroscope.Exporter) {
	t, err := p.Totals()
	if err != nil {
		logf("reading loss counters: %v", err)
	}
	pids := map[uint32]bool{} // traced: not those NVML alone shows
	for _, s := range t.Series {
		if s.Kind != memory.KindUntraced {
			pids[s.PID] = true
		}
	}
	sym := p.SymbolStats()
	line := fmt.Sprintf("status: %d processes, %d events, %d losses, %d unknown frees, symbol tables %d (%.1f MiB)",
		len(pids), t.Events, t.Losses.Total(), t.UnknownFrees, sym.Tables, float64(sym.IndexBytes+sym.NameBytes)/(1<<20))
	if exp != nil {
		line += o.pushes.Say(exp.Stats())
	}
	logf("%s", line)
	for _, l := range report.GrowthLines(o.last.Growing(), o.last.Exhaustion()) {
		logf("%s", l)
	}
}

// export ends one interval. Its snapshot, taken as it ends, goes to the
// breakdown and the growth, then to the gauges (its peaks, breakdown and
// growth) and the push, which keeps only what changes in its profiles; its
// memory is reused the next interval. The processes that exited before the
// interval before it are dropped then: each stays on /metrics one whole
// interval after the one that read its exit.
func (o *agentOptions) export(p *profiler.Profiler, exp *pyroscope.Exporter) {
	_ = p.EndInterval(&o.snapshot) // a loss counter's read error: said by the status line
	breakdown.Fill(&o.snapshot, o.target.rules.get())
	o.growth.Observe(&o.snapshot)
	o.last.Set(&o.snapshot)
	if exp != nil {
		exp.Export(&o.snapshot)
	}
	p.DropExitedBy(o.exitsBefore, &o.snapshot)
	o.exitsBefore = o.snapshot.Exits
}

// serveMetrics serves /metrics until ctx is done. A busy address is an error
// at start. exp, when there is one, adds the push counts. The agent's own
// footprint is there too, to watch it on a node: the Go runtime's metrics
// (go_goroutines, go_memstats_*, and go_gc_heap_live_bytes, the heap the
// last collection found in use) and the process's (process_resident_memory_bytes,
// process_cpu_seconds_total, process_open_fds).
func serveMetrics(ctx context.Context, addr string, books metrics.Collector, exp *pyroscope.Exporter) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics address: %w", err)
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(books,
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if exp != nil {
		registry.MustRegister(metrics.PushCollector{Source: exp})
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go server.Serve(lis)
	go func() {
		<-ctx.Done()
		server.Close()
	}()
	logs.Event(log, logs.ServingMetrics, fmt.Sprintf("serving metrics at http://%s/metrics", lis.Addr()), "address", lis.Addr().String())
	return nil
}

// watchPods names pods from the API server, when there is one.
func (o *agentOptions) watchPods(ctx context.Context) (*kube.Pods, error) {
	cfg, err := kube.Config(o.kubeconfig)
	if err != nil {
		return nil, usageError{fmt.Errorf("kubeconfig: %w", err)}
	}
	if cfg == nil {
		logf("no Kubernetes API server: pods are known by UID and container ID only")
		return nil, nil
	}
	cfg.Logf = logf
	pods, err := kube.WatchPods(ctx, cfg, o.nodeName)
	if err != nil {
		return nil, fmt.Errorf("watch pods: %w", err)
	}
	logf("watching the pods of node %s", o.nodeName)
	return pods, nil
}
