// Command soak runs `gpumem agent` for a long time under churn, as a busy
// node would: a new process every second (native and Python, some loading
// and unloading the driver), more than 100,000 distinct stacks over the
// run, and the Pyroscope receiver stopped and started again every few
// minutes. It samples the agent's RSS, goroutines, live heap and open files
// every 10 s, checks each process's books in the agent's metrics against
// the workload's own counts before the process exits, and the pushes
// against them after, and writes its figures to bench/soak/RESULTS.md
// (make bench copies them into BENCHMARKS.md). Run it as root after
// `make build sim` (make soak): 30 minutes by default.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
)

var (
	duration     = flag.Duration("duration", 30*time.Minute, "how long processes are started")
	rate         = flag.Float64("rate", 1, "processes started per second")
	stacksPer    = flag.Int("stacks", 150, "distinct stacks of each stacks process (a Python one allocates from twice as many)")
	interval     = flag.Duration("interval", 15*time.Second, "the agent's --pyroscope-interval")
	restartEvery = flag.Duration("restart-every", 5*time.Minute, "how often the Pyroscope receiver is stopped")
	downFor      = flag.Duration("down", 30*time.Second, "how long the receiver stays down each time")
	sampleEvery  = flag.Duration("sample", 10*time.Second, "how often the agent is sampled")
	out          = flag.String("o", "bench/soak/RESULTS.md", "where to write the figures")
	samplesOut   = flag.String("samples", "", "where to write every sample, as CSV (default: build/soak/samples.csv, beside the agent's log)")
	repo         = flag.String("repo", ".", "the repository root (bin/ and build/sim built)")
)

func main() {
	flag.Parse()
	if os.Geteuid() != 0 {
		fatalf("run as root: the agent loads BPF")
	}
	root, err := filepath.Abs(*repo)
	check(err)
	if *samplesOut == "" {
		// Every sample is for reading a run, not for the tree: RESULTS.md
		// says what a document needs of them.
		*samplesOut = filepath.Join(root, "build/soak/samples.csv")
	}
	// Ctrl-C ends the churn early; the run is then checked and written
	// as for its full duration.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	s, err := setUp(root)
	check(err)
	defer s.tearDown()
	r := s.run(ctx)
	check(os.MkdirAll(filepath.Dir(*out), 0o755))
	check(os.WriteFile(*out, []byte(r.markdown()), 0o644))
	check(os.WriteFile(*samplesOut, []byte(r.csv()), 0o644))
	fmt.Fprintf(os.Stderr, "soak: wrote %s and %s\n", *out, *samplesOut)
	fmt.Fprint(os.Stderr, r.markdown())
	if !r.passed() {
		os.Exit(1)
	}
}

// soak is one run: the agent, its private driver, the receiver, the
// workloads and what is measured.
type soak struct {
	root   string
	dir    string // the run's own files, build/soak: the driver copy, the agent's log
	driver string // the copy of the simulated driver the agent traces
	agent  *agent
	recv   *receiver
	books  *books
	tally  *pushTally

	mu      sync.Mutex
	procs   []*process
	samples []sample
	first   map[string]int // the next stack range of each stacks workload
	running sync.WaitGroup
}

func setUp(root string) (*soak, error) {
	for _, f := range []string{"bin/gpumem-lean", "build/sim/libcuda.so.1", "build/sim/simwork", "tests/workloads/simwork.py"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			return nil, fmt.Errorf("%s missing: run make build sim first", f)
		}
	}
	// The run's files, kept after it for a look at the agent's log.
	dir := filepath.Join(root, "build/soak")
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	s := &soak{root: root, dir: dir, driver: filepath.Join(dir, "libcuda.so.1"), first: map[string]int{}}
	// A copy of its own: a private inode, which no other process on the
	// machine maps, so that the agent traces the soak's processes only.
	if err := copyFile(filepath.Join(root, "build/sim/libcuda.so.1"), s.driver); err != nil {
		return nil, err
	}
	var err error
	if s.recv, err = startReceiver(); err != nil {
		return nil, err
	}
	s.tally = newPushTally()
	// The agent first, then the workloads, as on a node.
	s.agent, err = startAgent(filepath.Join(root, "bin/gpumem-lean"), s.driver, "http://"+s.recv.addr, *interval, filepath.Join(dir, "agent.log"))
	if err != nil {
		return nil, err
	}
	s.books = newBooks(s.agent.metricsURL)
	return s, nil
}

func (s *soak) tearDown() {
	s.agent.stop()
	s.recv.stop()
	fmt.Fprintf(os.Stderr, "soak: the agent's log is %s\n", filepath.Join(s.dir, "agent.log"))
}

// run churns for the duration, then lets the agent settle and checks it.
func (s *soak) run(ctx context.Context) *results {
	start := time.Now()
	churnCtx, endChurn := context.WithTimeout(ctx, *duration)
	defer endChurn()
	bg, stopBackground := context.WithCancel(context.Background())
	var background sync.WaitGroup
	for _, loop := range []func(context.Context){s.books.run, s.sampleLoop(start), s.foldPushes, s.recv.restartLoop(churnCtx)} {
		background.Add(1)
		go func() {
			defer background.Done()
			loop(bg)
		}()
	}

	tick := time.NewTicker(time.Duration(float64(time.Second) / *rate))
	for n := 0; churnCtx.Err() == nil; n++ {
		s.startProcess(n)
		select {
		case <-churnCtx.Done():
		case <-tick.C:
		}
	}
	tick.Stop()
	churned := time.Since(start)
	fmt.Fprintf(os.Stderr, "soak: churn over after %v; waiting for the last processes\n", churned.Round(time.Second))
	s.running.Wait()
	s.recv.up() // if the end found it down
	s.sampleNow(start)
	end := s.settle()
	stopBackground()
	background.Wait()
	s.tally.add(s.recv.r.Take())
	return s.results(start, churned, end)
}

// settle waits until the agent has dropped every exited process and
// delivered every interval, then reads its final state.
func (s *soak) settle() finalState {
	var f finalState
	deadline := time.Now().Add(3**interval + time.Minute)
	for {
		f = s.agent.final()
		if f.err == nil && f.pids == 0 && f.queued == 0 && strings.Contains(f.status, "status: 0 processes") || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	// One more interval: a push after the last exit, and the status line
	// after the last drop.
	time.Sleep(*interval + time.Second)
	f = s.agent.final()
	return f
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	o, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(o, in); err != nil {
		o.Close()
		return err
	}
	return o.Close()
}

// receiver is the strict Pyroscope receiver of the tests, served on one
// address that it leaves and takes again.
type receiver struct {
	r    *pyroscopetest.Receiver
	addr string

	mu       sync.Mutex
	stopFn   func() // nil while down
	restarts int
	since    time.Time     // down since
	downTime time.Duration // in all
}

func startReceiver() (*receiver, error) {
	rc := &receiver{r: &pyroscopetest.Receiver{}}
	if err := rc.listen("127.0.0.1:0"); err != nil {
		return nil, err
	}
	return rc, nil
}

// restartLoop stops the receiver every restartEvery, for downFor, until
// ctx (the churn's) is done.
func (rc *receiver) restartLoop(churn context.Context) func(context.Context) {
	return func(ctx context.Context) {
		for {
			select {
			case <-churn.Done():
				return
			case <-ctx.Done():
				return
			case <-time.After(*restartEvery):
			}
			rc.down()
			select {
			case <-churn.Done():
			case <-ctx.Done():
			case <-time.After(*downFor):
			}
			rc.up()
		}
	}
}

// listen serves the receiver on addr, and keeps the address it got.
func (rc *receiver) listen(addr string) error {
	var lis net.Listener
	var err error
	// The port was ours a moment ago: taken again at once, unless the
	// kernel still holds it.
	for try := 0; try < 50; try++ {
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("receiver: %w", err)
	}
	rc.addr = lis.Addr().String()
	rc.stopFn = pyroscopetest.Start(rc.r, lis).Stop
	return nil
}

// down stops the receiver: its connections closed, its port refused.
func (rc *receiver) down() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.stopFn == nil {
		return
	}
	rc.stopFn()
	rc.stopFn = nil
	rc.restarts++
	rc.since = time.Now()
	fmt.Fprintf(os.Stderr, "soak: receiver down\n")
}

// up serves the receiver again on its address, if it is down.
func (rc *receiver) up() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.stopFn != nil {
		return
	}
	check(rc.listen(rc.addr))
	rc.downTime += time.Since(rc.since)
	fmt.Fprintf(os.Stderr, "soak: receiver up\n")
}

func (rc *receiver) isUp() bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.stopFn != nil
}

func (rc *receiver) stop() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.stopFn != nil {
		rc.stopFn()
		rc.stopFn = nil
	}
}

func check(err error) {
	if err != nil {
		fatalf("%v", err)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "soak: "+format+"\n", args...)
	os.Exit(1)
}
