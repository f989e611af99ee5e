package kube

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/container"
)

var seedTime = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// seedCA is a self-signed certificate in PEM, as a kubeconfig embeds one,
// valid for ten years from 2026-12-01 (its key is random unless the test's
// randomness is fixed, as the seeds' generator fixes it).
func seedCA(t testing.TB) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"}, IsCA: true,
		NotBefore: seedTime, NotAfter: seedTime.AddDate(10, 0, 0), BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// seedFiles answers the files a fuzzed kubeconfig names: a CA for any
// path ending in .crt, nothing else (no file of this machine is read).
func seedFiles(ca []byte) func(string) ([]byte, error) {
	return func(path string) ([]byte, error) {
		if strings.HasSuffix(path, ".crt") {
			return ca, nil
		}
		return nil, os.ErrNotExist
	}
}

// FuzzKubeconfig: any kubeconfig gives a server to reach or an error; no
// plugin is run and no file read while parsing.
func FuzzKubeconfig(f *testing.F) {
	ca := seedCA(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := parseKubeconfig(data, "/nonexistent", seedFiles(ca))
		if err != nil {
			return
		}
		if s.Host == "" || s.TLS == nil {
			t.Fatalf("a server without a host or TLS: %+v", s)
		}
	})
}

// FuzzPodList: any page of a pod list decodes or is refused; pods map
// container IDs, never an empty one, to names.
func FuzzPodList(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		pods := map[string]Pod{}
		if _, _, err := decodePage(bytes.NewReader(data), pods); err != nil {
			return
		}
		for uid, pod := range pods {
			if _, ok := pod.Containers[""]; ok {
				t.Fatalf("pod %s: a container without an ID", uid)
			}
		}
	})
}

// FuzzWatch: any watch response is applied until it ends or breaks;
// what it leaves is looked up as any pod.
func FuzzWatch(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		w := &watcher{pods: &Pods{byUID: map[string]Pod{}}}
		_, err := w.apply(bytes.NewReader(data), "1")
		var status *statusError
		if err != nil && !errors.As(err, &status) {
			return
		}
		for uid, pod := range w.pods.byUID {
			for id := range pod.Containers {
				if id == "" {
					t.Fatalf("pod %s: a container without an ID", uid)
				}
				w.pods.Name(container.Identity{PodUID: uid, ContainerID: id})
			}
		}
	})
}
