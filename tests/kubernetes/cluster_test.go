// Package kubernetes tests gpu-mem against a real etcd and kube-apiserver on
// loopback (built by scripts/k8s-binaries.sh), with certificates made here.
package kubernetes

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"crypto/tls"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// hangLimit bounds every wait of these tests: no measure of speed, only a
// bound on a hang, generous enough for a machine busy with other tests.
const hangLimit = 2 * time.Minute

// cluster is a running etcd and kube-apiserver.
type cluster struct {
	dir        string
	kubeconfig string
	client     *kubernetes.Clientset
	apiserver  *exec.Cmd
	etcd       *exec.Cmd
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// certs makes a CA, the API server's serving certificate, an admin client
// certificate and the service account key pair.
func certs(t *testing.T, dir string) {
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := newKey()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gpu-mem test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "ca.crt"), "CERTIFICATE", caDER)
	issue := func(name string, tmpl *x509.Certificate) {
		key := newKey()
		tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		writePEM(t, filepath.Join(dir, name+".crt"), "CERTIFICATE", der)
		keyDER, _ := x509.MarshalECPrivateKey(key)
		writePEM(t, filepath.Join(dir, name+".key"), "EC PRIVATE KEY", keyDER)
	}
	issue("apiserver", &x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	issue("admin", &x509.Certificate{Subject: pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	saKey := newKey()
	saDER, _ := x509.MarshalECPrivateKey(saKey)
	writePEM(t, filepath.Join(dir, "sa.key"), "EC PRIVATE KEY", saDER)
	pubDER, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	writePEM(t, filepath.Join(dir, "sa.pub"), "PUBLIC KEY", pubDER)
}

// startCluster starts etcd and kube-apiserver and waits until the API
// server is ready.
func startCluster(t *testing.T) *cluster {
	bins := os.Getenv("GPUMEM_K8S_BIN")
	if bins == "" {
		t.Fatal("GPUMEM_K8S_BIN is not set: run the tests with make test (scripts/k8s-binaries.sh builds the binaries)")
	}
	dir := t.TempDir()
	certs(t, dir)
	c := &cluster{dir: dir}
	etcdPort, peerPort, apiPort := freePort(t), freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	c.etcd = exec.Command(filepath.Join(bins, "etcd"), "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort), "--log-level", "error")
	c.apiserver = exec.Command(filepath.Join(bins, "kube-apiserver"),
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(apiPort),
		"--tls-cert-file", filepath.Join(dir, "apiserver.crt"), "--tls-private-key-file", filepath.Join(dir, "apiserver.key"),
		"--client-ca-file", filepath.Join(dir, "ca.crt"),
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--authorization-mode", "RBAC",
		"--cert-dir", filepath.Join(dir, "cert"),
		"--v", "0")
	for _, cmd := range []*exec.Cmd{c.etcd, c.apiserver} {
		log, err := os.Create(filepath.Join(dir, filepath.Base(cmd.Path)+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if cmd == c.etcd {
			time.Sleep(time.Second)
		}
	}
	t.Cleanup(func() {
		for _, cmd := range []*exec.Cmd{c.apiserver, c.etcd} {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	c.kubeconfig = filepath.Join(dir, "kubeconfig")
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:%d", certificate-authority: %q}}]
users: [{name: admin, user: {client-certificate: %q, client-key: %q}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
`, apiPort, filepath.Join(dir, "ca.crt"), filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key"))
	if err := os.WriteFile(c.kubeconfig, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if c.client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	c.waitReady(t, apiPort)
	return c
}

func (c *cluster) waitReady(t *testing.T, port int) {
	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(filepath.Join(c.dir, "ca.crt"))
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(filepath.Join(c.dir, "admin.crt"), filepath.Join(c.dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	deadline := time.Now().Add(hangLimit)
	for time.Now().Before(deadline) {
		resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d/readyz", port))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(c.dir, "kube-apiserver.log"))
	t.Fatalf("kube-apiserver not ready:\n%s", tail(string(log), 3000))
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
