package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/snapshot"
)

func TestMetricsConfigFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "metrics.yaml")
	os.WriteFile(path, []byte(`
discovery: dns
dns-name: vllm.llm.svc
port: 8001
scrape-interval: 250ms
gateway: [http://a/.kvroute/v1/state, http://b/.kvroute/v1/state]
kv-events-port: 5557
`), 0o644)
	var o metricsOptions
	fl := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fl.StringVar(&o.discovery, "discovery", "", "")
	fl.StringVar(&o.dnsName, "dns-name", "", "")
	fl.IntVar(&o.port, "port", 8000, "")
	fl.DurationVar(&o.scrapeInterval, "scrape-interval", 100*time.Millisecond, "")
	fl.StringArrayVar(&o.gateways, "gateway", nil, "")
	fl.IntVar(&o.kvEventsPort, "kv-events-port", 0, "")
	// the command line wins over the file
	if err := fl.Parse([]string{"--port=9000"}); err != nil {
		t.Fatal(err)
	}
	if err := applyConfigFile(fl, path); err != nil {
		t.Fatal(err)
	}
	if o.discovery != "dns" || o.dnsName != "vllm.llm.svc" || o.port != 9000 || o.scrapeInterval != 250*time.Millisecond ||
		len(o.gateways) != 2 || o.gateways[1] != "http://b/.kvroute/v1/state" || o.kvEventsPort != 5557 {
		t.Errorf("options = %+v", o)
	}
	os.WriteFile(path, []byte("scrape-intervall: 1s\n"), 0o644)
	if err := applyConfigFile(fl, path); err == nil || !strings.Contains(err.Error(), "scrape-intervall") {
		t.Errorf("typo: %v", err)
	}
	os.WriteFile(path, []byte("kv-events-port: many\n"), 0o644)
	fresh := pflag.NewFlagSet("t2", pflag.ContinueOnError)
	fresh.Int("kv-events-port", 0, "")
	if err := applyConfigFile(fresh, path); err == nil {
		t.Error("bad value accepted")
	}
}

func TestMetricsOptionErrors(t *testing.T) {
	cases := []struct {
		o    metricsOptions
		want string
	}{
		{metricsOptions{}, "choose one discovery"},
		{metricsOptions{endpointsFile: "f", dnsName: "d"}, "choose one discovery"},
		{metricsOptions{discovery: "dns"}, "--dns-name"},
		{metricsOptions{discovery: "consul"}, "want static, dns or kubernetes"},
		{metricsOptions{discovery: "kubernetes", service: "vllm", kubeconfig: "/nonexistent/kubeconfig"}, "kubernetes discovery"},
	}
	for _, c := range cases {
		if _, err := c.o.source(nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err = %v, want %q", c.o, err, c.want)
		}
	}
	o := metricsOptions{gateways: []string{"http://gw"}, tokenEnv: "KVROUTE_TEST_UNSET_TOKEN"}
	if _, err := o.token(); err == nil || !strings.Contains(err.Error(), "KVROUTE_TEST_UNSET_TOKEN") {
		t.Errorf("no token: %v", err)
	}
	t.Setenv("KVROUTE_TEST_TOKEN", " abc \n")
	o.tokenEnv = "KVROUTE_TEST_TOKEN"
	if ts, err := o.token(); err != nil {
		t.Error(err)
	} else if tok, _ := ts.Token(); tok != "abc" {
		t.Errorf("token = %q", tok)
	}
}

// TestMetricsCommandEndToEnd runs the command's code path: a static file
// naming a fake engine, a gateway checking the token from a file, the
// service's own endpoints, JSON logs.
func TestMetricsCommandEndToEnd(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, `vllm:num_requests_waiting{model_name="m"} 3`)
		fmt.Fprintln(w, `vllm:num_requests_running{model_name="m"} 2`)
	}))
	defer engine.Close()
	var mu sync.Mutex
	var got []snapshot.State
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer file-token" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		var st snapshot.State
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &st); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		mu.Lock()
		got = append(got, st)
		mu.Unlock()
	}))
	defer gw.Close()

	dir := t.TempDir()
	eps := filepath.Join(dir, "endpoints.yaml")
	os.WriteFile(eps, []byte("endpoints:\n  - address: "+engine.Listener.Addr().String()+"\n    role: decode\n"), 0o644)
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("file-token\n"), 0o600)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	listen := ln.Addr().String()
	ln.Close()

	o := metricsOptions{endpointsFile: eps, gateways: []string{gw.URL + "/.kvroute/v1/state"}, tokenFile: tok,
		scrapeInterval: 50 * time.Millisecond, pushInterval: time.Second, pushTimeout: time.Second,
		metricsPath: "/metrics", listen: listen, name: "cli-test", logLevel: "info", logFormat: "json"}
	var logs bytes.Buffer
	var logMu sync.Mutex
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runMetrics(ctx, &o, writerFunc(func(p []byte) (int, error) { logMu.Lock(); defer logMu.Unlock(); return logs.Write(p) }))
	}()

	var st snapshot.State
	if !testenv.Poll(5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(got) > 0 {
			st = got[len(got)-1]
		}
		return len(st.Hosts) == 1 && st.Hosts[0].Healthy
	}) {
		t.Fatalf("no healthy snapshot at the gateway; logs:\n%s", logs.String())
	}
	if h := st.Hosts[0]; h.Waiting != 3 || h.Running != 2 || h.Role != "decode" || h.Model != "m" || st.Source != "cli-test" {
		t.Errorf("snapshot = %+v", st)
	}
	resp, err := http.Get("http://" + listen + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/healthz = %d", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("runMetrics: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("runMetrics did not return")
	}
	logMu.Lock()
	first := strings.SplitN(logs.String(), "\n", 2)[0]
	logMu.Unlock()
	var rec map[string]any
	if err := json.Unmarshal([]byte(first), &rec); err != nil || rec["msg"] == nil {
		t.Errorf("log line is not slog JSON: %q", first)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestMetricsManifestArgs keeps the shipped Kubernetes manifest and the
// command in step: every argument it passes must parse as a flag of
// `kvroute metrics`, and it must pick Kubernetes discovery.
func TestMetricsManifestArgs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "envoy", "kubernetes", "metrics.yaml"))
	if err != nil {
		t.Skipf("SKIPPED: no envoy/kubernetes/metrics.yaml (%v)", err)
	}
	var args []string
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var obj struct {
			Kind string `json:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Args []string `json:"args"`
						} `json:"containers"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Kind == "Deployment" && len(obj.Spec.Template.Spec.Containers) > 0 {
			args = obj.Spec.Template.Spec.Containers[0].Args
		}
	}
	if len(args) == 0 || args[0] != "metrics" {
		t.Fatalf("the Deployment does not run `kvroute metrics`: args %q", args)
	}
	cmd, _, err := rootCmd.Find([]string{"metrics"})
	if err != nil || cmd.Name() != "metrics" {
		t.Fatalf("metrics command not registered: %v", err)
	}
	fl := pflag.NewFlagSet("manifest", pflag.ContinueOnError)
	fl.AddFlagSet(cmd.Flags())
	if err := fl.Parse(args[1:]); err != nil {
		t.Fatalf("manifest args %q: %v", args[1:], err)
	}
	if v, _ := fl.GetString("discovery"); v != "kubernetes" {
		t.Errorf("manifest discovery = %q", v)
	}
	for _, name := range []string{"gateway", "token-file", "listen"} {
		if !fl.Changed(name) {
			t.Errorf("manifest does not set --%s", name)
		}
	}
}
