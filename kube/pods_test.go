package kube

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/internal/waitfor"
)

// fakeServer serves /api/v1/pods as the API server does: a list, then
// watches that stream the events sent to it, the first watch answered with
// 410 Gone when gone is set (its version expired: the client lists again).
type fakeServer struct {
	t      *testing.T
	srv    *httptest.Server
	events chan string
	mu     sync.Mutex
	pods   []string // the list's items
	lists  int
	auth   []string // Authorization headers seen
	certs  []string // client certificate subjects seen
	gone   bool
}

func newFakeServer(t *testing.T) *fakeServer {
	f := &fakeServer{t: t, events: make(chan string, 10)}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeServer) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		f.certs = append(f.certs, r.TLS.PeerCertificates[0].Subject.CommonName)
	}
	f.mu.Unlock()
	if r.URL.Path != "/api/v1/pods" || r.URL.Query().Get("fieldSelector") != "spec.nodeName=node-1" {
		http.Error(w, "unexpected request "+r.URL.String(), http.StatusBadRequest)
		return
	}
	if r.URL.Query().Get("watch") == "" {
		f.mu.Lock()
		f.lists++
		items := fmt.Sprint(f.pods)
		f.mu.Unlock()
		fmt.Fprintf(w, `{"kind":"PodList","metadata":{"resourceVersion":"10"},"items":[%s]}`, items[1:len(items)-1])
		return
	}
	f.mu.Lock()
	gone := f.gone
	f.gone = false
	f.mu.Unlock()
	if gone {
		fmt.Fprint(w, `{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old resource version"}}`)
		return
	}
	w.(http.Flusher).Flush()
	for {
		select {
		case ev := <-f.events:
			fmt.Fprintln(w, ev)
			w.(http.Flusher).Flush()
		case <-r.Context().Done():
			return
		}
	}
}

func podJSON(uid, name, version, containerID string) string {
	return fmt.Sprintf(`{"metadata":{"name":%q,"namespace":"ml","uid":%q,"resourceVersion":%q,"labels":{"pod-template-hash":"5d9f8"},
"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"trainer-5d9f8","controller":true}]},
"spec":{"nodeName":"node-1"},"status":{"phase":"Running","containerStatuses":[{"name":"trainer","containerID":"containerd://%s","ready":true}]}}`,
		name, uid, version, containerID)
}

func writeCA(t *testing.T, srv *httptest.Server, path string) {
	t.Helper()
	data := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func (f *fakeServer) seen() (lists int, auth, certs []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lists, append([]string(nil), f.auth...), append([]string(nil), f.certs...)
}

// TestPodsInCluster: with the service account's files, the pods of the
// node are listed, then watched: names come, change and go; a watch whose
// version expired lists again.
func TestPodsInCluster(t *testing.T) {
	f := newFakeServer(t)
	f.pods = []string{podJSON("uid-1", "trainer-5d9f8-x2x7z", "9", "c1")}
	f.gone = true
	dir := t.TempDir()
	writeCA(t, f.srv, filepath.Join(dir, "ca.crt"))
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("secret-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(f.srv.Listener.Addr().String())
	t.Setenv("KUBERNETES_SERVICE_HOST", host)
	t.Setenv("KUBERNETES_SERVICE_PORT", port)
	s, err := inCluster(dir)
	if err != nil || s == nil {
		t.Fatalf("in cluster: %v, %v", s, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pods, err := WatchPods(ctx, s, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	c1 := container.Identity{PodUID: "uid-1", ContainerID: "c1"}
	if got := pods.Name(c1); got.Namespace != "ml" || got.Pod != "trainer-5d9f8-x2x7z" || got.Name != "trainer" || got.Workload != "trainer" {
		t.Errorf("named %+v", got)
	}
	// The first watch is refused as too old: a second list, then a watch.
	waitfor.Condition(t, "a second list", time.Minute, func() bool { lists, _, _ := f.seen(); return lists == 2 })

	f.events <- `{"type":"ADDED","object":` + podJSON("uid-2", "other", "11", "c2") + `}`
	f.events <- `{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"12"}}}`
	waitfor.Condition(t, "the added pod", time.Minute, func() bool { _, ok := pods.Lookup(container.Identity{PodUID: "uid-2"}); return ok })
	f.events <- `{"type":"DELETED","object":` + podJSON("uid-1", "trainer-5d9f8-x2x7z", "13", "c1") + `}`
	waitfor.Condition(t, "the deleted pod", time.Minute, func() bool { _, ok := pods.Lookup(c1); return !ok })
	if got := pods.Name(container.Identity{PodUID: "uid-2", ContainerID: "c2"}); got.Pod != "other" || got.Name != "trainer" {
		t.Errorf("named %+v", got)
	}
	_, auth, _ := f.seen()
	for _, a := range auth {
		if a != "Bearer secret-1" {
			t.Errorf("Authorization %q", a)
		}
	}
}

// TestPodsKubeconfig: a kubeconfig's current context, with paths relative
// to the file and a client certificate.
func TestPodsKubeconfig(t *testing.T) {
	f := newFakeServer(t)
	f.pods = []string{podJSON("uid-1", "trainer-5d9f8-x2x7z", "9", "c1")}
	dir := t.TempDir()
	writeCA(t, f.srv, filepath.Join(dir, "ca.crt"))
	writeClientCert(t, filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key"))
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- {name: other, cluster: {server: "https://192.0.2.1:6443"}}
- {name: test, cluster: {server: %q, certificate-authority: ca.crt}}
users: [{name: admin, user: {client-certificate: admin.crt, client-key: admin.key}}]
contexts:
- {name: other, context: {cluster: other, user: admin}}
- {name: test, context: {cluster: test, user: admin}}
current-context: test
`, f.srv.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Config(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pods, err := WatchPods(ctx, s, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pods.Lookup(container.Identity{PodUID: "uid-1"}); !ok {
		t.Error("the listed pod is unknown")
	}
	if _, _, certs := f.seen(); len(certs) == 0 || certs[0] != "admin" {
		t.Errorf("client certificates %v", certs)
	}
}

func TestKubeconfigErrors(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"no context":    "current-context: missing\n",
		"no server":     "current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\n",
		"auth provider": "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: https://k}}]\nusers: [{name: u, user: {auth-provider: {name: gcp}}}]\n",
	} {
		path := filepath.Join(dir, "kubeconfig")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Config(path); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func writeClientCert(t *testing.T, certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "admin"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
}
