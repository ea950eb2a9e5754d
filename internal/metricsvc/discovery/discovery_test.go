package discovery

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/internal/testenv"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// updates records what a Source reports.
type updates struct {
	mu   sync.Mutex
	sets [][]Endpoint
}

func (u *updates) add(eps []Endpoint) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.sets = append(u.sets, eps)
}

func (u *updates) last() ([]Endpoint, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.sets) == 0 {
		return nil, 0
	}
	return u.sets[len(u.sets)-1], len(u.sets)
}

func (u *updates) waitFor(t *testing.T, what string, cond func([]Endpoint) bool) []Endpoint {
	t.Helper()
	var eps []Endpoint
	if !testenv.Poll(testenv.WaitTimeout, func() bool {
		var n int
		eps, n = u.last()
		return n > 0 && cond(eps)
	}) {
		t.Fatalf("timed out waiting for %s; last set %+v", what, eps)
	}
	return eps
}

func addrs(eps []Endpoint) string {
	var s []string
	for _, e := range eps {
		s = append(s, e.Address)
	}
	return strings.Join(s, ",")
}

func TestParseFile(t *testing.T) {
	eps, err := ParseFile([]byte(`
endpoints:
  - address: 10.0.0.7:8000
    role: decode
    model: llama-3-8b
    adapters: [sql-lora]
    kvEvents: tcp://10.0.0.7:5557
  - address: "[fd00::1]:8000"
`))
	if err != nil {
		t.Fatal(err)
	}
	if empty, err := ParseFile([]byte("endpoints: []\n")); err != nil || len(empty) != 0 {
		t.Errorf("explicitly empty fleet: %v %v", empty, err)
	}
	if len(eps) != 2 || eps[0].Role != "decode" || eps[0].Adapters[0] != "sql-lora" || eps[0].KVEvents != "tcp://10.0.0.7:5557" || eps[1].Role != "both" {
		t.Errorf("eps = %+v", eps)
	}
	bad := map[string]string{
		"unknown key":   "endpoints:\n  - address: a:1\n    rol: decode\n",
		"no port":       "endpoints:\n  - address: 10.0.0.7\n",
		"bad port":      "endpoints:\n  - address: 10.0.0.7:99999\n",
		"bad role":      "endpoints:\n  - address: a:1\n    role: leader\n",
		"bad kv events": "endpoints:\n  - address: a:1\n    kvEvents: 10.0.0.7:5557\n",
		"duplicate":     "endpoints:\n  - address: a:1\n  - address: a:1\n",
		"not yaml":      "endpoints: [\n",
		"wrong type":    "endpoints: 3\n",
	}
	for name, text := range bad {
		if _, err := ParseFile([]byte(text)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("endpoints:\n  - address: 127.0.0.1:8001\n")
	var u updates
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &testenv.LockedBuffer{}
	src := &File{Path: path, Poll: 10 * time.Millisecond, Log: slog.New(slog.NewTextHandler(logs, nil))}
	go src.Run(ctx, u.add)
	u.waitFor(t, "first list", func(e []Endpoint) bool { return addrs(e) == "127.0.0.1:8001" })
	write("endpoints:\n  - address: 127.0.0.1:8001\n  - address: 127.0.0.1:8002\n    role: prefill\n")
	u.waitFor(t, "reload", func(e []Endpoint) bool { return addrs(e) == "127.0.0.1:8001,127.0.0.1:8002" })
	_, n := u.last()
	write("endpoints:\n  - address: broken\n# longer so the size changes\n")
	testenv.WaitFor(t, "the invalid file read and refused", func() bool { return strings.Contains(logs.String(), "changed but is invalid") })
	if eps, n2 := u.last(); n2 != n || len(eps) != 2 {
		t.Errorf("invalid file replaced the list: %+v", eps)
	}
	if err := (&File{Path: path + ".nope"}).Run(ctx, u.add); err == nil {
		t.Error("missing file: no error")
	}
}

type fakeResolver struct {
	mu      sync.Mutex
	ips     []string
	err     error
	lookups int
}

func (r *fakeResolver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lookups
}

func (r *fakeResolver) set(err error, ips ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ips, r.err = ips, err
}

func (r *fakeResolver) LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lookups++
	if r.err != nil {
		return nil, r.err
	}
	var out []net.IPAddr
	for _, s := range r.ips {
		out = append(out, net.IPAddr{IP: net.ParseIP(s)})
	}
	return out, nil
}

func TestDNSRefresh(t *testing.T) {
	r := &fakeResolver{}
	r.set(nil, "10.0.0.2", "10.0.0.1", "fd00::7")
	d := &DNS{Host: "vllm.default.svc", Port: 8000, Role: "decode", Model: "m", KVEventsPort: 5557,
		Refresh: 10 * time.Millisecond, Resolver: r, Log: quiet()}
	var u updates
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go d.Run(ctx, u.add)
	eps := u.waitFor(t, "first", func(e []Endpoint) bool { return len(e) == 3 })
	if addrs(eps) != "10.0.0.1:8000,10.0.0.2:8000,[fd00::7]:8000" {
		t.Errorf("addrs = %s", addrs(eps))
	}
	if eps[2].KVEvents != "tcp://[fd00::7]:5557" || eps[0].Role != "decode" || eps[0].Model != "m" {
		t.Errorf("eps = %+v", eps)
	}
	// a transient failure keeps the set
	_, n := u.last()
	r.set(&net.DNSError{Err: "server misbehaving", IsTemporary: true})
	// Two lookups since: the first failed one has been acted on.
	from := r.count()
	testenv.WaitFor(t, "two failed lookups", func() bool { return r.count() >= from+2 })
	if eps, n2 := u.last(); n2 != n || len(eps) != 3 {
		t.Errorf("temporary DNS failure changed the set: %+v", eps)
	}
	// a scale-down is seen
	r.set(nil, "10.0.0.2")
	u.waitFor(t, "scale down", func(e []Endpoint) bool { return addrs(e) == "10.0.0.2:8000" })
	// no records at all: the Service has no ready pods
	r.set(&net.DNSError{Err: "no such host", IsNotFound: true})
	u.waitFor(t, "empty", func(e []Endpoint) bool { return len(e) == 0 })
}

func TestDNSRealResolverLocalhost(t *testing.T) {
	d := &DNS{Host: "localhost", Port: 8000}
	eps, err := d.Resolve(context.Background())
	if err != nil {
		t.Fatalf("resolving localhost with the system resolver: %v", err)
	}
	found := false
	for _, e := range eps {
		if e.Address == "127.0.0.1:8000" || e.Address == "[::1]:8000" {
			found = true
		}
	}
	if !found {
		t.Errorf("localhost resolved to %s", addrs(eps))
	}
}

// The Kubernetes source is tested against client-go's fake clientset: no
// API server can run here. The informers, listers and label selection are
// client-go's own; the fake only stands in for the API server.
func TestKubernetesEndpointSlices(t *testing.T) {
	ready, notReady := true, false
	port := func(name string, p int32) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: &name, Port: &p}
	}
	pod := func(name, role, model string) *corev1.Pod {
		l := map[string]string{}
		if role != "" {
			l[DefaultRoleLabel] = role
		}
		if model != "" {
			l[DefaultModelLabel] = model
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: l}}
	}
	ep := func(ip, podName string, r *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: r},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: podName, Namespace: "llm"}}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm-abc", Namespace: "llm",
			Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{port("metrics", 9090), port("http", 8000)},
		Endpoints: []discoveryv1.Endpoint{
			ep("10.1.0.1", "vllm-0", &ready),
			ep("10.1.0.2", "vllm-1", nil), // no condition: ready
			ep("10.1.0.3", "vllm-2", &notReady),
		},
	}
	other := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "other-x", Namespace: "llm",
			Labels: map[string]string{discoveryv1.LabelServiceName: "other"}},
		Ports:     []discoveryv1.EndpointPort{port("http", 8000)},
		Endpoints: []discoveryv1.Endpoint{ep("10.9.9.9", "x", &ready)},
	}
	client := fake.NewClientset(slice, other,
		pod("vllm-0", "prefill", "llama-3-8b"), pod("vllm-1", "", "llama-3-8b"), pod("vllm-2", "decode", ""))

	k := &Kubernetes{Client: client, Namespace: "llm", Service: "vllm", PortName: "http", KVEventsPort: 5557, Log: quiet()}
	var u updates
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- k.Run(ctx, u.add) }()
	eps := u.waitFor(t, "initial", func(e []Endpoint) bool { return len(e) > 0 })
	if addrs(eps) != "10.1.0.1:8000,10.1.0.2:8000" {
		t.Fatalf("addrs = %s (not-ready pods and other services must be excluded)", addrs(eps))
	}
	if eps[0].Role != "prefill" || eps[0].Model != "llama-3-8b" || eps[1].Role != "both" || eps[0].KVEvents != "tcp://10.1.0.1:5557" {
		t.Errorf("eps = %+v", eps)
	}

	// vllm-2 becomes ready; vllm-0 goes away.
	s2 := slice.DeepCopy()
	s2.Endpoints = []discoveryv1.Endpoint{ep("10.1.0.2", "vllm-1", nil), ep("10.1.0.3", "vllm-2", &ready)}
	if _, err := client.DiscoveryV1().EndpointSlices("llm").Update(ctx, s2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eps = u.waitFor(t, "update", func(e []Endpoint) bool { return addrs(e) == "10.1.0.2:8000,10.1.0.3:8000" })
	if eps[1].Role != "decode" {
		t.Errorf("vllm-2 role = %q", eps[1].Role)
	}
	// A pod relabelled: its role changes without any slice change.
	p1 := pod("vllm-1", "decode", "llama-3-70b")
	if _, err := client.CoreV1().Pods("llm").Update(ctx, p1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	u.waitFor(t, "relabel", func(e []Endpoint) bool { return len(e) == 2 && e[0].Role == "decode" && e[0].Model == "llama-3-70b" })

	// Selector mode picks slices by label.
	k2 := &Kubernetes{Client: client, Namespace: "llm", Selector: discoveryv1.LabelServiceName + " in (vllm,other)", PortName: "http", Log: quiet()}
	var u2 updates
	go k2.Run(ctx, u2.add)
	u2.waitFor(t, "selector", func(e []Endpoint) bool { return addrs(e) == "10.1.0.2:8000,10.1.0.3:8000,10.9.9.9:8000" })

	for _, bad := range []*Kubernetes{
		{Client: client, Namespace: "llm"},
		{Client: client, Namespace: "llm", Service: "a", Selector: "b=c"},
		{Client: client, Namespace: "llm", Selector: "a in ("},
		{Client: client, Service: "vllm"},
	} {
		if err := bad.Run(ctx, func([]Endpoint) {}); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
}
