package v8host

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
)

//go:embed host.mjs
var script []byte

// Config says what a Host runs.
type Config struct {
	// Module is the path of the Wasm module.
	Module string
	// RootID selects the plugin in the module (kvroute.router, ...).
	RootID string
	// VMID is the plugin's vm_id (shared data is per vm_id); default "kvroute".
	VMID string
	// Configuration is the plugin configuration, as Envoy passes it.
	Configuration string
	// Upstreams are the "host:port" addresses of the routed cluster.
	Upstreams []string
	// DestinationHeader is the header whose first entry picks the upstream;
	// default "x-gateway-destination-endpoint". Without it a request goes to
	// the upstreams in turn.
	DestinationHeader string
	// Workers is the number of VMs; default 1.
	Workers int
	// Verbose copies the module's warnings and errors to node's stderr
	// (Host.Stderr).
	Verbose bool
	// CompileEagerly compiles every function of the module when the host
	// starts (seconds for kvroute's module) instead of at its first call.
	// Envoy's V8 compiles lazily, so a VM's first requests, and its first
	// garbage collection, which enters Go's collector for the first time,
	// pay for compiling what they enter (TurboFan work spread over the first
	// GC cycle, a few thousand requests in); benchmarks that measure the steady state set it.
	CompileEagerly bool
	// TimeHostCalls times every host function call (Stats.HostCalls); it
	// costs two clock reads per call, so benchmarks leave it off.
	TimeHostCalls bool
}

// Host is a running V8 host (a node process).
type Host struct {
	// Filtered, Plain and Admin are base URLs: the proxy with the filter,
	// the same proxy without it, and the admin listener.
	Filtered, Plain, Admin string
	// Node is the node version that runs the host.
	Node string

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	dir    string
	stderr *testenv.LockedBuffer
	once   sync.Once
}

// Stats is what the admin listener reports.
type Stats struct {
	// CPU is the node process's user and system time so far.
	CPU time.Duration
	// Callbacks is the time inside the VM's callbacks (host functions
	// included), in all and per callback ("request_body", ...).
	Callbacks   time.Duration
	PerCallback map[string]time.Duration
	// CallCount is how many times each callback ran.
	CallCount map[string]int
	// HostCalls and HostCallCount are the time inside host functions and
	// their number (Config.TimeHostCalls only).
	HostCalls     time.Duration
	HostCallCount int
	Traps         int
	FailedVMs     int
	Logs          map[string]int
	LastErrors    []string
	Unknown       []string
	Metrics       map[string]Metric
}

// Metric is one of the module's metrics. Samples are filled by
// StatsWithSamples only.
type Metric struct {
	Type    int       `json:"type"`
	Value   float64   `json:"value"`
	Count   int       `json:"count"`
	Samples []float64 `json:"samples"`
}

// Available reports whether node (20 or later) is on PATH, with an error
// that says how to get it.
func Available() error {
	out, err := exec.Command("node", "--version").Output()
	if err != nil {
		return errors.New("v8host: node is not on PATH: install Node.js 20 or later (Debian: apt-get install nodejs)")
	}
	v := strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
	major, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
	if major < 20 {
		return fmt.Errorf("v8host: node %s is too old: Node.js 20 or later is needed (its WASI preview1 runs without flags)", v)
	}
	return nil
}

// Start starts a host and waits until it listens. Close stops it.
func Start(cfg Config) (*Host, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if cfg.VMID == "" {
		cfg.VMID = "kvroute"
	}
	if cfg.DestinationHeader == "" {
		cfg.DestinationHeader = "x-gateway-destination-endpoint"
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	module, err := filepath.Abs(cfg.Module)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "v8host")
	if err != nil {
		return nil, err
	}
	spec, _ := json.Marshal(map[string]any{
		"module": module, "rootId": cfg.RootID, "vmId": cfg.VMID, "configuration": cfg.Configuration,
		"upstreams": cfg.Upstreams, "destinationHeader": strings.ToLower(cfg.DestinationHeader),
		"workers": cfg.Workers, "verbose": cfg.Verbose, "timeHostCalls": cfg.TimeHostCalls,
	})
	scriptPath, specPath := filepath.Join(dir, "host.mjs"), filepath.Join(dir, "spec.json")
	if err := os.WriteFile(scriptPath, script, 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := os.WriteFile(specPath, spec, 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	h := &Host{dir: dir, stderr: &testenv.LockedBuffer{Max: 1 << 20}}
	args := []string{"--no-liftoff", "--no-warnings"}
	if cfg.CompileEagerly {
		args = append(args, "--no-wasm-lazy-compilation")
	}
	h.cmd = exec.Command("node", append(args, scriptPath, specPath)...)
	h.cmd.Stderr = h.stderr
	h.stdin, _ = h.cmd.StdinPipe()
	stdout, _ := h.cmd.StdoutPipe()
	if err := h.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("v8host: starting node: %w", err)
	}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			ready <- fmt.Errorf("v8host: node exited before listening: %s", strings.TrimSpace(h.stderr.String()))
			return
		}
		var ports struct {
			Filtered, Plain, Admin int
			Node                   string
		}
		if err := json.Unmarshal([]byte(line), &ports); err != nil {
			ready <- fmt.Errorf("v8host: unexpected first line from node %q: %v", line, err)
			return
		}
		u := func(p int) string { return "http://127.0.0.1:" + strconv.Itoa(p) }
		h.Filtered, h.Plain, h.Admin, h.Node = u(ports.Filtered), u(ports.Plain), u(ports.Admin), ports.Node
		ready <- nil
		io.Copy(io.Discard, stdout)
	}()
	select {
	case err = <-ready:
	case <-time.After(2 * time.Minute):
		err = errors.New("v8host: node did not listen within 2 minutes")
	}
	if err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// Close stops the node process and removes its files.
func (h *Host) Close() {
	h.once.Do(func() {
		h.stdin.Close()
		done := make(chan struct{})
		go func() { h.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			h.cmd.Process.Kill()
			<-done
		}
		os.RemoveAll(h.dir)
	})
}

// Stderr is what node wrote to standard error (the module's warnings when
// Verbose is set, and node's own errors).
func (h *Host) Stderr() string { return h.stderr.String() }

// Stats reads the admin listener.
func (h *Host) Stats() (Stats, error) { return h.stats(false) }

// StatsWithSamples is Stats with every histogram sample (up to 100,000 per
// metric).
func (h *Host) StatsWithSamples() (Stats, error) { return h.stats(true) }

func (h *Host) stats(samples bool) (Stats, error) {
	url := h.Admin + "/stats"
	if samples {
		url += "?samples"
	}
	resp, err := http.Get(url)
	if err != nil {
		return Stats{}, err
	}
	defer resp.Body.Close()
	var raw struct {
		CPUUs      float64            `json:"cpuUs"`
		CallbackNs float64            `json:"callbackNs"`
		HostCallNs float64            `json:"hostCallNs"`
		HostCallN  int                `json:"hostCalls"`
		Callbacks  map[string]float64 `json:"callbacks"`
		CallCounts map[string]int     `json:"callbackCounts"`
		Traps      int                `json:"traps"`
		FailedVMs  int                `json:"failedVMs"`
		Logs       map[string]int     `json:"logs"`
		LastErrors []string           `json:"lastErrors"`
		Unknown    []string           `json:"unknownProperties"`
		Metrics    map[string]Metric  `json:"metrics"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		return Stats{}, fmt.Errorf("v8host: admin stats: %w", err)
	}
	s := Stats{
		CPU: time.Duration(raw.CPUUs) * time.Microsecond, Callbacks: time.Duration(raw.CallbackNs),
		PerCallback: map[string]time.Duration{}, HostCalls: time.Duration(raw.HostCallNs), HostCallCount: raw.HostCallN, Traps: raw.Traps, FailedVMs: raw.FailedVMs, Logs: raw.Logs,
		LastErrors: raw.LastErrors, Unknown: raw.Unknown, Metrics: raw.Metrics, CallCount: raw.CallCounts,
	}
	for k, v := range raw.Callbacks {
		s.PerCallback[k] = time.Duration(v)
	}
	return s, nil
}

// SharedData returns a shared-data key's value and CAS, and whether it is
// set, as the VMs see it.
func (h *Host) SharedData(key string) ([]byte, uint32, bool, error) {
	resp, err := http.Get(h.Admin + "/shared?key=" + url.QueryEscape(key))
	if err != nil {
		return nil, 0, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, 0, false, nil
	}
	var e struct {
		Value []byte `json:"value"` // base64 in JSON
		CAS   uint32 `json:"cas"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		return nil, 0, false, fmt.Errorf("v8host: admin shared data: %w", err)
	}
	return e.Value, e.CAS, true, nil
}
