package kube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/internal/waitfor"
)

// TestAPIServerGoneAndBack (issue 21, point 3; docs/faults.md): the API
// server goes away in the middle of a watch, and a pod is created while it
// is gone. The pods known keep their names meanwhile; once it answers at
// the same address, the watch lists again and the new pod is named. Each
// change is said once.
func TestAPIServerGoneAndBack(t *testing.T) {
	f := newFakeServer(t)
	f.pods = []string{podJSON("uid-1", "trainer-5d9f8-x2x7z", "9", "c1")}
	pool := x509.NewCertPool()
	pool.AddCert(f.srv.Certificate())
	var mu sync.Mutex
	var logs []string
	s := &APIServer{Host: f.srv.URL, TLS: &tls.Config{RootCAs: pool}, Logf: func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		logs = append(logs, fmt.Sprintf(format, args...))
	}}
	said := func(what string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, l := range logs {
			if strings.Contains(l, what) {
				n++
			}
		}
		return n
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pods, err := WatchPods(ctx, s, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	c1 := container.Identity{PodUID: "uid-1", ContainerID: "c1"}
	if got := pods.Name(c1); got.Pod != "trainer-5d9f8-x2x7z" {
		t.Fatalf("named %+v", got)
	}
	// A watch event goes through: the watch is on.
	f.events <- `{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"10"}}}`
	waitfor.Condition(t, "the watch to take the event", time.Minute, func() bool { return len(f.events) == 0 })

	// Gone: every connection cut, the port closed.
	addr := f.srv.Listener.Addr().String()
	f.srv.CloseClientConnections()
	f.srv.Close()
	waitfor.Condition(t, "the loss said", time.Minute, func() bool { return said("pods: the API server: ") == 1 })
	f.mu.Lock()
	lists := f.lists
	// One item: the fake joins the list's items with spaces.
	f.pods = []string{f.pods[0] + "," + podJSON("uid-2", "created-while-down", "11", "c2")}
	f.mu.Unlock()
	if got := pods.Name(c1); got.Pod != "trainer-5d9f8-x2x7z" {
		t.Errorf("while gone, named %+v", got)
	}

	// Back at the same address, with the same certificate.
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.Listener.Close()
	f.srv.Listener = lis
	f.srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	c2 := container.Identity{PodUID: "uid-2", ContainerID: "c2"}
	waitfor.Condition(t, "the pod created while gone", time.Minute, func() bool { _, ok := pods.Lookup(c2); return ok })
	if got := pods.Name(c2); got.Pod != "created-while-down" || got.Namespace != "ml" {
		t.Errorf("named %+v", got)
	}
	waitfor.Condition(t, "the return said", time.Minute, func() bool { return said("pods: the API server answers again: 2 pods of the node listed") == 1 })
	if n := said("pods: the API server: "); n != 1 {
		t.Errorf("the loss said %d times, want once: %q", n, logs)
	}
	if got, _, _ := f.seen(); got != lists+1 {
		t.Errorf("%d lists after the return, want 1", got-lists)
	}
	// The watch goes on: an event after the return applies.
	f.events <- `{"type":"DELETED","object":` + podJSON("uid-1", "trainer-5d9f8-x2x7z", "13", "c1") + `}`
	waitfor.Condition(t, "the deleted pod", time.Minute, func() bool { _, ok := pods.Lookup(c1); return !ok })
	mu.Lock()
	defer mu.Unlock()
	t.Logf("logged %q", logs)
	if len(logs) != 2 {
		t.Errorf("logged %q, want the loss and the return", logs)
	}
}
