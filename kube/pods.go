package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// Pod is what the API server says of a pod.
type Pod struct {
	Namespace, Name string
	Workload        string            // the owner's name (a Deployment's, for its ReplicaSets), else the pod's
	Labels          map[string]string // the pod's labels
	Containers      map[string]string // container ID -> container name
	// Tensors: the pod asks for the tensor view (TensorsAnnotation "true"),
	// as TensorsAsk says (TensorsUntilAnnotation, TensorsBudgetAnnotation);
	// TensorsErr: its annotations cannot be read.
	Tensors    bool
	TensorsAsk snapshot.TensorAsk
	TensorsErr error
}

// The annotations by which a pod asks the agent for its tensor view.
const (
	TensorsAnnotation       = "gpu-mem.io/tensors"        // "true"
	TensorsUntilAnnotation  = "gpu-mem.io/tensors-until"  // an RFC 3339 time
	TensorsBudgetAnnotation = "gpu-mem.io/tensors-budget" // a share of the process's time ("0.25", "25%"), 0: none
)

// Pods keeps the pods of one node, from a list and watch of the API
// server's pods with a field selector on the node: the informer pattern,
// reading only the fields kept. It is safe for concurrent use; a watch that
// fails is retried, and what was known stays until the pod is deleted.
type Pods struct {
	mu    sync.RWMutex
	byUID map[string]Pod
}

// WatchPods watches the pods scheduled on node until ctx is done. It
// returns once the pods are listed, or after 10 seconds if the API server
// does not answer: the watch then goes on retrying.
func WatchPods(ctx context.Context, s *APIServer, node string) (*Pods, error) {
	if s == nil {
		return nil, errors.New("no API server")
	}
	p := &Pods{byUID: map[string]Pod{}}
	w := &watcher{server: s, client: s.client(), pods: p, selector: "spec.nodeName=" + node, synced: make(chan struct{})}
	go w.run(ctx)
	select {
	case <-w.synced:
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
	}
	return p, nil
}

// apiPod is the part of a v1 Pod read.
type apiPod struct {
	Metadata struct {
		Name, Namespace, UID string
		ResourceVersion      string
		Labels               map[string]string
		Annotations          map[string]string
		OwnerReferences      []struct {
			Kind, Name string
			Controller *bool
		}
	}
	Status struct {
		ContainerStatuses, InitContainerStatuses []struct {
			Name, ContainerID string
		}
	}
}

type watcher struct {
	server   *APIServer
	client   *http.Client
	pods     *Pods
	selector string
	synced   chan struct{} // closed at the first list
	once     sync.Once
}

// Backoff bounds between failed lists or watches, and how long one watch
// lasts before it is renewed.
const (
	firstRetry   = time.Second
	maxRetry     = 30 * time.Second
	watchTimeout = 5 * time.Minute
)

func (w *watcher) run(ctx context.Context) {
	retry := firstRetry
	down := false // said: the server does not answer
	for ctx.Err() == nil {
		version, err := w.list(ctx)
		if err == nil && down {
			down = false
			w.logf("pods: the API server answers again: %d pods of the node listed", w.pods.count())
		}
		for err == nil && ctx.Err() == nil {
			retry = firstRetry
			version, err = w.watch(ctx, version)
		}
		if ctx.Err() != nil {
			return
		}
		var gone *statusError
		if errors.As(err, &gone) && gone.code == http.StatusGone {
			continue // the version is too old: list again at once
		}
		if !down {
			// Said once, not at each retry while it lasts.
			down = true
			w.logf("pods: the API server: %v; the pods known keep their names, retrying", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		retry = min(2*retry, maxRetry)
	}
}

func (w *watcher) logf(format string, args ...any) {
	if w.server.Logf != nil {
		w.server.Logf(format, args...)
	}
}

func (p *Pods) count() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.byUID)
}

// list replaces the pods with the server's, page by page, and returns the
// version to watch from.
func (w *watcher) list(ctx context.Context) (string, error) {
	pods := map[string]Pod{}
	var version, next string
	pages := 0
	for {
		q := url.Values{"fieldSelector": {w.selector}, "limit": {"500"}}
		if next != "" {
			q.Set("continue", next)
		}
		if pages++; pages > maxPages {
			return "", fmt.Errorf("list pods: more than %d pages", maxPages)
		}
		resp, err := w.server.get(ctx, w.client, "/api/v1/pods?"+q.Encode())
		if err != nil {
			return "", err
		}
		version, next, err = decodePage(resp.Body, pods)
		resp.Body.Close()
		if err != nil {
			return "", err
		}
		if next == "" {
			break
		}
	}
	w.pods.mu.Lock()
	w.pods.byUID = pods
	w.pods.mu.Unlock()
	w.once.Do(func() { close(w.synced) })
	return version, nil
}

// maxPages bounds the pages of one list: a node's pods fit in one (500 a
// page), and a server that keeps answering with a continue token must not
// keep the agent listing.
const maxPages = 1000

// decodePage reads one page of a list of pods into pods and returns the
// list's version and the token of the next page ("" for the last).
func decodePage(r io.Reader, pods map[string]Pod) (version, next string, err error) {
	var page struct {
		Metadata struct {
			ResourceVersion string
			Continue        string
		}
		Items []apiPod
	}
	if err := json.NewDecoder(r).Decode(&page); err != nil {
		return "", "", err
	}
	for _, pod := range page.Items {
		pods[pod.Metadata.UID] = pod.info()
	}
	return page.Metadata.ResourceVersion, page.Metadata.Continue, nil
}

// watch applies the server's changes from version until the watch ends,
// and returns the version to go on from.
func (w *watcher) watch(ctx context.Context, version string) (string, error) {
	q := url.Values{"fieldSelector": {w.selector}, "watch": {"1"}, "resourceVersion": {version},
		"allowWatchBookmarks": {"true"}, "timeoutSeconds": {strconv.Itoa(int(watchTimeout.Seconds()))}}
	resp, err := w.server.get(ctx, w.client, "/api/v1/pods?"+q.Encode())
	if err != nil {
		return version, err
	}
	defer resp.Body.Close()
	return w.apply(resp.Body, version)
}

// apply applies the events of a watch's response body from version until
// it ends, and returns the version to go on from.
func (w *watcher) apply(body io.Reader, version string) (string, error) {
	dec := json.NewDecoder(body)
	for {
		var ev struct {
			Type   string
			Object json.RawMessage
		}
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return version, nil // the server ended the watch: renew it
			}
			return version, err
		}
		if ev.Type == "ERROR" {
			var status struct {
				Code    int
				Message string
			}
			json.Unmarshal(ev.Object, &status)
			return version, &statusError{code: status.Code, body: status.Message}
		}
		var pod apiPod
		if err := json.Unmarshal(ev.Object, &pod); err != nil {
			return version, err
		}
		version = pod.Metadata.ResourceVersion
		w.pods.mu.Lock()
		switch ev.Type {
		case "ADDED", "MODIFIED":
			w.pods.byUID[pod.Metadata.UID] = pod.info()
		case "DELETED":
			delete(w.pods.byUID, pod.Metadata.UID)
		}
		w.pods.mu.Unlock()
	}
}

func (pod *apiPod) info() Pod {
	info := Pod{Namespace: pod.Metadata.Namespace, Name: pod.Metadata.Name, Workload: pod.workload(),
		Labels: pod.Metadata.Labels, Containers: map[string]string{}}
	info.Tensors, info.TensorsAsk, info.TensorsErr = tensorsAsked(pod.Metadata.Annotations)
	for _, s := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
		// containerd://ID, cri-o://ID, docker://ID
		if _, id, ok := strings.Cut(s.ContainerID, "://"); ok && id != "" {
			info.Containers[id] = s.Name
		}
	}
	return info
}

// tensorsAsked reads a pod's ask for its tensor view from its annotations;
// an error (the pod asks, in words that cannot be read) names the
// annotation.
func tensorsAsked(annotations map[string]string) (bool, snapshot.TensorAsk, error) {
	var ask snapshot.TensorAsk
	v, ok := annotations[TensorsAnnotation]
	if !ok {
		return false, ask, nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return true, ask, fmt.Errorf("%s: want true or false, got %q", TensorsAnnotation, v)
	}
	if !on {
		return false, ask, nil
	}
	if v, ok := annotations[TensorsUntilAnnotation]; ok {
		if ask.Until, err = time.Parse(time.RFC3339, v); err != nil {
			return true, ask, fmt.Errorf("%s: want an RFC 3339 time (2026-12-02T10:00:00Z), got %q", TensorsUntilAnnotation, v)
		}
	}
	if v, ok := annotations[TensorsBudgetAnnotation]; ok {
		share, err := snapshot.ParseBudget(v)
		if err != nil {
			return true, ask, fmt.Errorf("%s: %w", TensorsBudgetAnnotation, err)
		}
		ask.Budget = &share
	}
	return true, ask, nil
}

// workload names what runs the pod: a Deployment (through its ReplicaSet,
// whose name ends in the template hash), another owner, or the pod itself.
func (pod *apiPod) workload() string {
	for _, o := range pod.Metadata.OwnerReferences {
		if o.Controller == nil || !*o.Controller {
			continue
		}
		if hash := pod.Metadata.Labels["pod-template-hash"]; o.Kind == "ReplicaSet" && hash != "" {
			return strings.TrimSuffix(o.Name, "-"+hash)
		}
		return o.Name
	}
	return pod.Metadata.Name
}

// Name fills in the names the API server gave a container, its pod's and
// its own (a container.Namer); a nil Pods names nothing.
func (p *Pods) Name(c container.Identity) container.Identity {
	if pod, ok := p.Lookup(c); ok {
		c.Namespace, c.Pod, c.Workload = pod.Namespace, pod.Name, pod.Workload
		c.Name = pod.Containers[c.ContainerID]
	}
	return c
}

// TensorsWanted says whether the container's pod asks for the tensor view,
// and how; an error when it asks in annotations that cannot be read. A
// profiler.TensorPolicy.
func (p *Pods) TensorsWanted(c container.Identity) (snapshot.TensorAsk, bool, error) {
	pod, ok := p.Lookup(c)
	if !ok || !pod.Tensors {
		return snapshot.TensorAsk{}, false, nil
	}
	return pod.TensorsAsk, true, pod.TensorsErr
}

// Lookup returns what is known of the pod a container runs in.
func (p *Pods) Lookup(c container.Identity) (Pod, bool) {
	if p == nil || c.PodUID == "" {
		return Pod{}, false
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	pod, ok := p.byUID[c.PodUID]
	return pod, ok
}
