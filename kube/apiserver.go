package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
)

// The API server is reached with net/http, not client-go: the agent reads
// one resource (its node's pods, a few fields of each), and client-go with
// the API's types is most of a binary that, linked in, the agent would map
// on every node.

// APIServer is how to reach a Kubernetes API server and prove who we are.
type APIServer struct {
	Host string // https://host:port
	TLS  *tls.Config
	auth func(*http.Request) error
	// refresh, when not nil, forgets cached credentials after a 401.
	refresh func()

	// Logf, when not nil, is told once when the server stops answering
	// a watch of pods, and once when it answers again.
	Logf func(format string, args ...any)
}

// Service account files, in a pod.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// Config finds the API server: kubeconfig when given, else the in-cluster
// configuration; nil when neither exists.
func Config(kubeconfig string) (*APIServer, error) {
	if kubeconfig != "" {
		return fromKubeconfig(kubeconfig)
	}
	return inCluster(serviceAccountDir)
}

// inCluster is the pod's service account, as kubelet mounts it. Its token
// is read again as kubelet rotates it.
func inCluster(dir string) (*APIServer, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, nil
	}
	pool, err := certPool(readFileLimited, filepath.Join(dir, "ca.crt"), "")
	if err != nil {
		return nil, err
	}
	tokenFile := filepath.Join(dir, "token")
	if _, err := os.Stat(tokenFile); err != nil {
		return nil, fmt.Errorf("service account token: %w", err)
	}
	return &APIServer{
		Host: "https://" + net.JoinHostPort(host, port),
		TLS:  &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		auth: bearerFile(tokenFile),
	}, nil
}

// kubeconfig is the part of a kubeconfig file gpumem reads.
type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Contexts       []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster string `yaml:"cluster"`
			User    string `yaml:"user"`
		} `yaml:"context"`
	} `yaml:"contexts"`
	Clusters []struct {
		Name    string `yaml:"name"`
		Cluster struct {
			Server                   string `yaml:"server"`
			CertificateAuthority     string `yaml:"certificate-authority"`
			CertificateAuthorityData string `yaml:"certificate-authority-data"`
			InsecureSkipTLSVerify    bool   `yaml:"insecure-skip-tls-verify"`
			TLSServerName            string `yaml:"tls-server-name"`
		} `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string   `yaml:"name"`
		User kubeUser `yaml:"user"`
	} `yaml:"users"`
}

type kubeUser struct {
	ClientCertificate     string      `yaml:"client-certificate"`
	ClientCertificateData string      `yaml:"client-certificate-data"`
	ClientKey             string      `yaml:"client-key"`
	ClientKeyData         string      `yaml:"client-key-data"`
	Token                 string      `yaml:"token"`
	TokenFile             string      `yaml:"tokenFile"`
	Username              string      `yaml:"username"`
	Password              string      `yaml:"password"`
	Exec                  *execConfig `yaml:"exec"`
	AuthProvider          *struct {
		Name string `yaml:"name"`
	} `yaml:"auth-provider"`
}

// execConfig is a credential plugin (client.authentication.k8s.io).
type execConfig struct {
	Command    string   `yaml:"command"`
	Args       []string `yaml:"args"`
	APIVersion string   `yaml:"apiVersion"`
	Env        []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
}

// fromKubeconfig reads the current context of a kubeconfig file: server,
// CA, and a client certificate, token, token file, basic auth or
// credential plugin. Relative paths are relative to the file, as kubectl
// has them.
func fromKubeconfig(path string) (*APIServer, error) {
	data, err := readFileLimited(path)
	if err != nil {
		return nil, err
	}
	s, err := parseKubeconfig(data, filepath.Dir(path), readFileLimited)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// parseKubeconfig reads a kubeconfig file's contents; relative paths are
// relative to dir, and the files they name are read with readFile.
func parseKubeconfig(data []byte, dir string, readFile func(string) ([]byte, error)) (*APIServer, error) {
	var kc kubeconfig
	if err := yaml.Unmarshal(data, &kc); err != nil {
		return nil, err
	}
	rel := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	var clusterName, userName string
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			clusterName, userName = c.Context.Cluster, c.Context.User
		}
	}
	if clusterName == "" {
		return nil, fmt.Errorf("no context %q", kc.CurrentContext)
	}
	s := &APIServer{TLS: &tls.Config{MinVersion: tls.VersionTLS12}}
	found := false
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		found = true
		s.Host = strings.TrimSuffix(c.Cluster.Server, "/")
		s.TLS.ServerName = c.Cluster.TLSServerName
		s.TLS.InsecureSkipVerify = c.Cluster.InsecureSkipTLSVerify
		if c.Cluster.CertificateAuthority != "" || c.Cluster.CertificateAuthorityData != "" {
			var err error
			if s.TLS.RootCAs, err = certPool(readFile, rel(c.Cluster.CertificateAuthority), c.Cluster.CertificateAuthorityData); err != nil {
				return nil, fmt.Errorf("cluster %s: %w", clusterName, err)
			}
		}
	}
	if !found || s.Host == "" {
		return nil, fmt.Errorf("no server for cluster %q", clusterName)
	}
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		if err := s.setUser(u.User, rel, readFile); err != nil {
			return nil, fmt.Errorf("user %s: %w", userName, err)
		}
	}
	return s, nil
}

func (s *APIServer) setUser(u kubeUser, rel func(string) string, readFile func(string) ([]byte, error)) error {
	if u.ClientCertificate != "" || u.ClientCertificateData != "" {
		cert, err := readPEM(readFile, rel(u.ClientCertificate), u.ClientCertificateData)
		if err != nil {
			return err
		}
		key, err := readPEM(readFile, rel(u.ClientKey), u.ClientKeyData)
		if err != nil {
			return err
		}
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			return err
		}
		s.TLS.Certificates = []tls.Certificate{pair}
	}
	switch {
	case u.Token != "":
		s.auth = func(r *http.Request) error { r.Header.Set("Authorization", "Bearer "+u.Token); return nil }
	case u.TokenFile != "":
		s.auth = bearerFile(rel(u.TokenFile))
	case u.Username != "":
		s.auth = func(r *http.Request) error { r.SetBasicAuth(u.Username, u.Password); return nil }
	case u.Exec != nil:
		p := &execPlugin{cfg: *u.Exec}
		s.auth, s.refresh = p.authorize, p.forget
	case u.AuthProvider != nil:
		return fmt.Errorf("auth-provider %s is not supported: use a token, a client certificate or an exec plugin", u.AuthProvider.Name)
	}
	return nil
}

func readPEM(readFile func(string) ([]byte, error), file, data string) ([]byte, error) {
	if data != "" {
		return base64.StdEncoding.DecodeString(data)
	}
	return readFile(file)
}

// maxConfigFile bounds a kubeconfig file and the certificate, key and CA
// files it names: a path such as /dev/zero must not be read for ever.
const maxConfigFile = 4 << 20

// readFileLimited reads a configuration file of at most maxConfigFile bytes.
func readFileLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigFile {
		return nil, fmt.Errorf("%s: more than %d bytes", path, maxConfigFile)
	}
	return data, nil
}

func certPool(readFile func(string) ([]byte, error), file, data string) (*x509.CertPool, error) {
	pem, err := readPEM(readFile, file, data)
	if err != nil {
		return nil, fmt.Errorf("certificate authority: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("certificate authority: no PEM certificate")
	}
	return pool, nil
}

// bearerFile authorizes with a token read from a file, again a minute
// later at most: bound service account tokens rotate.
func bearerFile(path string) func(*http.Request) error {
	var mu sync.Mutex
	var token string
	var read time.Time
	return func(r *http.Request) error {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(read) > time.Minute {
			data, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("token: %w", err)
			}
			token, read = strings.TrimSpace(string(data)), time.Now()
		}
		r.Header.Set("Authorization", "Bearer "+token)
		return nil
	}
}

// execPlugin runs a credential plugin and keeps its token until it
// expires or the server refuses it.
type execPlugin struct {
	cfg     execConfig
	mu      sync.Mutex
	token   string
	expires time.Time
}

func (p *execPlugin) authorize(r *http.Request) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.token == "" || (!p.expires.IsZero() && time.Until(p.expires) < 10*time.Second) {
		if err := p.run(); err != nil {
			return err
		}
	}
	r.Header.Set("Authorization", "Bearer "+p.token)
	return nil
}

func (p *execPlugin) forget() {
	p.mu.Lock()
	p.token = ""
	p.mu.Unlock()
}

func (p *execPlugin) run() error {
	cmd := exec.Command(p.cfg.Command, p.cfg.Args...)
	cmd.Env = os.Environ()
	for _, e := range p.cfg.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	info, _ := json.Marshal(map[string]any{"apiVersion": p.cfg.APIVersion, "kind": "ExecCredential", "spec": map[string]any{"interactive": false}})
	cmd.Env = append(cmd.Env, "KUBERNETES_EXEC_INFO="+string(info))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("credential plugin %s: %w: %s", p.cfg.Command, err, strings.TrimSpace(stderr.String()))
	}
	var cred struct {
		Status struct {
			Token               string    `json:"token"`
			ExpirationTimestamp time.Time `json:"expirationTimestamp"`
		} `json:"status"`
	}
	if err := json.Unmarshal(out, &cred); err != nil {
		return fmt.Errorf("credential plugin %s: %w", p.cfg.Command, err)
	}
	if cred.Status.Token == "" {
		return fmt.Errorf("credential plugin %s: no token (client certificates from plugins are not supported)", p.cfg.Command)
	}
	p.token, p.expires = cred.Status.Token, cred.Status.ExpirationTimestamp
	return nil
}

// client is an HTTP client for the server; without a timeout, for watches.
func (s *APIServer) client() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     s.TLS,
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
	}}
}

// get sends an authorized GET of path (with its query) and returns the
// response when it is 200 OK.
func (s *APIServer) get(ctx context.Context, c *http.Client, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.Host+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "gpumem")
	if s.auth != nil {
		if err := s.auth(req); err != nil {
			return nil, err
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := readSome(resp)
		if resp.StatusCode == http.StatusUnauthorized && s.refresh != nil {
			s.refresh()
		}
		return nil, &statusError{code: resp.StatusCode, body: body}
	}
	return resp, nil
}

func readSome(resp *http.Response) (string, error) {
	defer resp.Body.Close()
	buf := make([]byte, 512)
	n, err := resp.Body.Read(buf)
	return strings.TrimSpace(string(buf[:n])), err
}

type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string { return fmt.Sprintf("API server: %d %s", e.code, e.body) }
