// Package control is the agent's control socket: a Unix socket, for root
// alone, over which `gpumem tensors` switches a process's tensor view on and
// off while the agent and the process run (on a host without Kubernetes;
// in a cluster, a pod's annotation does it). It speaks HTTP:
//
//	GET    /tensors                     the tensor views, JSON
//	PUT    /tensors/PID?for=D&budget=S  on for process PID, for duration D (none:
//	                                    until off), at most share S of its time
//	                                    (none: the agent's --tensor-budget; 0: no
//	                                    budget)
//	DELETE /tensors/PID                 off
package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-mem/gpu-mem/snapshot"
)

// DefaultSocket is where the agent listens unless told otherwise.
const DefaultSocket = "/run/gpumem/control.sock"

// Switch is what the socket drives: a profiler.
type Switch interface {
	SetTensors(pid int, ask snapshot.TensorAsk) error
	StopTensors(pid int) error
	TensorViews() []snapshot.TensorView
}

// Serve listens on the Unix socket at path (made for root alone, a stale
// one replaced) and serves s until ctx is done.
func Serve(ctx context.Context, path string, s Switch) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return fmt.Errorf("control socket: another agent serves %s", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("control socket: %w", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("control socket: %w", err)
	}
	server := &http.Server{Handler: Handler(s), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		server.Close()
		os.Remove(path)
	}()
	go server.Serve(l)
	return nil
}

// Handler serves the socket's requests.
func Handler(s Switch) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /tensors", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(s.TensorViews())
	})
	mux.HandleFunc("PUT /tensors/{pid}", func(w http.ResponseWriter, r *http.Request) {
		pid, err := strconv.Atoi(r.PathValue("pid"))
		if err != nil {
			http.Error(w, "not a PID: "+r.PathValue("pid"), http.StatusBadRequest)
			return
		}
		ask := snapshot.TensorAsk{By: snapshot.ByControl}
		if d := r.URL.Query().Get("for"); d != "" {
			length, err := time.ParseDuration(d)
			if err != nil || length <= 0 {
				http.Error(w, "for: want a positive duration, got "+d, http.StatusBadRequest)
				return
			}
			ask.Until = time.Now().Add(length)
		}
		if b := r.URL.Query().Get("budget"); b != "" {
			share, err := snapshot.ParseBudget(b)
			if err != nil {
				http.Error(w, "budget: "+err.Error(), http.StatusBadRequest)
				return
			}
			ask.Budget = &share
		}
		if err := s.SetTensors(pid, ask); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
		}
	})
	mux.HandleFunc("DELETE /tensors/{pid}", func(w http.ResponseWriter, r *http.Request) {
		pid, err := strconv.Atoi(r.PathValue("pid"))
		if err != nil {
			http.Error(w, "not a PID: "+r.PathValue("pid"), http.StatusBadRequest)
			return
		}
		if err := s.StopTensors(pid); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
		}
	})
	return mux
}

// Client talks to an agent's control socket.
type Client struct {
	http *http.Client
}

// Dial returns a client of the socket at path.
func Dial(path string) *Client {
	return &Client{http: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}}
}

// SetTensors switches process pid's tensor view on, for length (0: until
// off), at most budget's share of its time (nil: the agent's budget).
func (c *Client) SetTensors(pid int, length time.Duration, budget *float64) error {
	q := url.Values{}
	if length > 0 {
		q.Set("for", length.String())
	}
	if budget != nil {
		q.Set("budget", strconv.FormatFloat(*budget, 'g', -1, 64))
	}
	u := fmt.Sprintf("http://agent/tensors/%d", pid)
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return c.do(http.MethodPut, u, nil)
}

// StopTensors switches process pid's tensor view off.
func (c *Client) StopTensors(pid int) error {
	return c.do(http.MethodDelete, fmt.Sprintf("http://agent/tensors/%d", pid), nil)
}

// TensorViews lists the agent's tensor views.
func (c *Client) TensorViews() ([]snapshot.TensorView, error) {
	var views []snapshot.TensorView
	return views, c.do(http.MethodGet, "http://agent/tensors", &views)
}

func (c *Client) do(method, url string, into any) error {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("agent's control socket: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("agent's control socket: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent: %s", strings.TrimRight(string(body), "\r\n"))
	}
	if into != nil {
		return json.Unmarshal(body, into)
	}
	return nil
}
