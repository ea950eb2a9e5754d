package wasmhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
)

// DefaultDestinationHeader is the header the router reads the chosen host
// from, as configured in kvroute's shipped Envoy configurations.
const DefaultDestinationHeader = "x-gateway-destination-endpoint"

// Config describes one host: the module, its plugins (the filter chain),
// the upstream clusters and the route. The zero values of the optional
// fields are Envoy's defaults.
type Config struct {
	// Module is the Wasm binary. ModulePath is read when Module is nil.
	// Both may be empty only when Filters is empty (a plain proxy, the
	// benchmark baseline).
	Module     []byte
	ModulePath string

	// Workers is the number of VMs, one per Envoy worker thread (default 2).
	// Dispatch says how streams are spread over them.
	Workers  int
	Dispatch Dispatch

	// VMID is the vm_id: shared data and queues are scoped by it.
	VMID string
	// VMConfiguration is the vm_config configuration, readable at any time.
	VMConfiguration string
	// Env is vm_config.environment_variables: what the module's WASI
	// environ (os.Getenv) sees. Envoy passes nothing else.
	Env map[string]string

	// Filters is the HTTP filter chain, in decoding order, each a plugin of
	// the same module told apart by root id. The router comes last.
	Filters []Filter

	// Clusters maps a cluster name to its endpoints ("host:port"). The
	// route cluster and dispatch_http_call targets are looked up here.
	Clusters map[string][]string
	// RouteCluster is the cluster the route forwards to.
	RouteCluster string
	// DirectResponse, when set, makes the route answer itself (Envoy's
	// route direct_response) instead of forwarding: the filters run, then
	// the router replies with this status and body.
	DirectResponse *DirectResponse
	// DestinationHeader is the request header the host override reads
	// (default DefaultDestinationHeader).
	DestinationHeader string
	// OriginalDst selects the ORIGINAL_DST cluster mode (use_http_header):
	// the destination header must hold one IP:port, which is dialed even if
	// it is not in RouteCluster. Without it the override_host policy runs.
	OriginalDst bool

	// FailOpen is the plugin's failure policy for a failed VM: false
	// (Envoy's default, FAIL_CLOSED) answers 503; true lets requests pass
	// the filter untouched.
	FailOpen bool

	// RemoveRequestHeaders are removed from every request before the Wasm
	// filters run, as Envoy's header_mutation filter placed before them
	// does (request_mutations: remove): what still strips a client's
	// routing headers when a failed VM lets requests pass untouched.
	RemoveRequestHeaders []string

	// LogLevel is what proxy_get_log_level answers; 0 means LevelInfo,
	// Envoy's default. Every log line is recorded whatever its level.
	LogLevel int
	// Logger, when set, also receives every log line.
	Logger *slog.Logger

	// StreamIdleTimeout answers 408 to a stream with no activity (Envoy's
	// default 5 minutes). RouteTimeout answers 504 when the upstream has
	// not completed the response this long after the request ended
	// (Envoy's default 15 s); negative disables it. ConnectTimeout bounds
	// one upstream connection attempt (default 5 s).
	StreamIdleTimeout time.Duration
	RouteTimeout      time.Duration
	ConnectTimeout    time.Duration
	// DelayedCloseTimeout is how long a connection whose stream ended
	// before its request body stays open for the client to finish sending
	// (Envoy's delayed_close_timeout, default 1 s): the rest of the body is
	// read and dropped meanwhile, so a client still writing it reads the
	// response instead of meeting a reset.
	DelayedCloseTimeout time.Duration
	// BufferLimitBytes is the per-stream buffer limit (Envoy's connection
	// buffer limit, default 1 MiB): a request body a filter buffers
	// (StopIterationAndBuffer, the SDK's Pause in a body callback) past it
	// gets 413.
	BufferLimitBytes int

	// CompilationCacheDir persists wazero's compiled code across processes
	// (compiling the module takes about a second). Empty uses
	// $XDG_CACHE_HOME/kvroute/wazero; "-" keeps the cache in memory only.
	CompilationCacheDir string

	// Clock, when set, is the proxy's wall clock: what
	// proxy_get_current_time_nanoseconds answers and what WASI's realtime
	// clock (time.Now in a Go module) reads. A test sets a clock it moves
	// itself to step the module's time instead of sleeping through it:
	// recency buckets, staleness and intervals the module keeps in wall
	// time then pass as fast, and as exactly, as the test says. Nil is
	// time.Now.
	//
	// Only the wall clock follows it. WASI's monotonic clock stays real:
	// the module measures latencies with it (time.Since) and the Go runtime
	// schedules by it, and both must see time pass. The host's call
	// statistics stay on real time: they measure what the module costs.
	// Ticks (proxy_set_tick_period_milliseconds) stay real timers too: a
	// clock given as a function cannot schedule anything, so a test that
	// moves the clock runs the ticks it wants with FireTicks, and the
	// module's own checks against this clock decide what each tick does.
	Clock func() time.Time

	// PollOneoffUnsupported makes poll_oneoff answer ENOSYS, as Envoy
	// releases without the poll_oneoff host fix do (golang/go#78513), to
	// test modules built for them.
	PollOneoffUnsupported bool
}

// Dispatch is how streams are spread over the worker VMs.
type Dispatch int

const (
	// DispatchConnection, the default, runs every stream of a downstream
	// connection on one worker, picked by a hash of the client's address.
	// That is Envoy's model: a connection belongs to the worker thread that
	// accepted it (the kernel spreads connections over the workers' listen
	// sockets by a hash of the address), so one keep-alive client meets one
	// VM, whose heap stays in the cache between its requests.
	DispatchConnection Dispatch = iota
	// DispatchStream hands streams to the workers in turn whatever their
	// connection, so that a test with one client runs every VM (what the
	// workers share, what a trapped worker leaves to the others).
	DispatchStream
)

// DirectResponse is a route's fixed answer.
type DirectResponse struct {
	Status int
	Body   string
}

// Filter is one Wasm HTTP filter: a plugin of the module.
type Filter struct {
	// Name is the plugin name (plugin_name property); default RootID.
	Name string
	// RootID selects the root context in the module ("kvroute.router").
	RootID string
	// Configuration is the plugin configuration, readable only during
	// on_configure and the root's on_context_create (not on_vm_start).
	Configuration string
	// AllowOnHeadersStopIteration is Envoy's allow_on_headers_stop_iteration
	// (>= 1.35). Without it a Pause in the headers callbacks becomes
	// StopAllIterationAndWatermark: the body is held and not delivered to
	// the filter until it resumes.
	AllowOnHeadersStopIteration bool
}

func (f *Filter) name() string {
	if f.Name != "" {
		return f.Name
	}
	return f.RootID
}

// Host is a running proxy-wasm host. It is an http.Handler; Serve runs it
// on a listener. Close releases it.
type Host struct {
	cfg      Config
	runtime  wazero.Runtime
	compiled wazero.CompiledModule
	vms      []*vm
	clusters map[string]*cluster

	calls   *callStats
	shared  *sharedData
	queues  *sharedQueues
	metrics *metricStore
	logs    *logStore

	transport *http.Transport

	nextWorker        atomic.Int64
	activeStreams     atomic.Int64
	vmFailures        atomic.Int64
	failClosedReplies atomic.Int64

	upMu       sync.Mutex
	upRequests map[string]int

	srvMu   sync.Mutex
	servers []*http.Server
	done    chan struct{}
	closed  atomic.Bool
}

var (
	memCacheOnce sync.Once
	memCache     wazero.CompilationCache
	dirCaches    sync.Map // dir -> wazero.CompilationCache
)

func compilationCache(dir string) wazero.CompilationCache {
	if dir == "-" {
		memCacheOnce.Do(func() { memCache = wazero.NewCompilationCache() })
		return memCache
	}
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return compilationCache("-")
		}
		dir = filepath.Join(base, "kvroute", "wazero")
	}
	if c, ok := dirCaches.Load(dir); ok {
		return c.(wazero.CompilationCache)
	}
	c, err := wazero.NewCompilationCacheWithDir(dir)
	if err != nil {
		return compilationCache("-")
	}
	actual, _ := dirCaches.LoadOrStore(dir, c)
	return actual.(wazero.CompilationCache)
}

// New compiles the module (through the compilation cache), starts
// cfg.Workers VMs and, on each, one root context per filter (on_vm_start,
// on_configure). A plugin that fails to start makes New fail with a
// *PluginStartError naming the plugin and quoting the module's log.
func New(ctx context.Context, cfg Config) (*Host, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.DestinationHeader == "" {
		cfg.DestinationHeader = DefaultDestinationHeader
	}
	if cfg.LogLevel == 0 {
		cfg.LogLevel = LevelInfo
	}
	if cfg.StreamIdleTimeout <= 0 {
		cfg.StreamIdleTimeout = 5 * time.Minute
	}
	if cfg.RouteTimeout == 0 {
		cfg.RouteTimeout = 15 * time.Second
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	if cfg.DelayedCloseTimeout <= 0 {
		cfg.DelayedCloseTimeout = time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.BufferLimitBytes <= 0 {
		cfg.BufferLimitBytes = 1 << 20
	}
	for i, f := range cfg.Filters {
		if f.RootID == "" {
			return nil, fmt.Errorf("wasmhost: Filters[%d] has no RootID; set it to the root id the module registers (for example \"kvroute.router\")", i)
		}
	}
	if cfg.RouteCluster != "" && cfg.Clusters[cfg.RouteCluster] == nil && !cfg.OriginalDst {
		return nil, fmt.Errorf("wasmhost: RouteCluster %q is not in Clusters", cfg.RouteCluster)
	}

	h := &Host{
		cfg:        cfg,
		clusters:   map[string]*cluster{},
		calls:      &callStats{},
		shared:     newSharedData(),
		queues:     newSharedQueues(),
		metrics:    newMetricStore(),
		logs:       &logStore{logger: cfg.Logger},
		upRequests: map[string]int{},
		done:       make(chan struct{}),
	}
	for name, addrs := range cfg.Clusters {
		h.clusters[name] = newCluster(name, addrs)
	}
	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout}
	h.transport = &http.Transport{
		DialContext:         dialer.DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     60 * time.Second,
		DisableCompression:  true,
	}

	if len(cfg.Filters) == 0 {
		return h, nil
	}
	module := cfg.Module
	if module == nil {
		if cfg.ModulePath == "" {
			return nil, errors.New("wasmhost: Config.Module and Config.ModulePath are both empty; build the module with `make wasm` and pass dist/kvroute.wasm")
		}
		b, err := os.ReadFile(cfg.ModulePath)
		if err != nil {
			return nil, fmt.Errorf("wasmhost: read module: %w (run `make wasm` first)", err)
		}
		module = b
	}
	rc := wazero.NewRuntimeConfig().WithCompilationCache(compilationCache(cfg.CompilationCacheDir)).WithCloseOnContextDone(false)
	h.runtime = wazero.NewRuntimeWithConfig(ctx, rc)
	if err := instantiateHostModules(ctx, h.runtime, h.calls); err != nil {
		h.runtime.Close(ctx)
		return nil, fmt.Errorf("wasmhost: host modules: %w", err)
	}
	compiled, err := h.runtime.CompileModule(ctx, module)
	if err != nil {
		h.runtime.Close(ctx)
		return nil, fmt.Errorf("wasmhost: Failed to load Wasm code: %w", err)
	}
	if err := checkModule(compiled); err != nil {
		h.runtime.Close(ctx)
		return nil, err
	}
	h.compiled = compiled
	for i := 0; i < cfg.Workers; i++ {
		v, err := h.startVM(ctx, i)
		if err != nil {
			h.Close()
			return nil, err
		}
		h.vms = append(h.vms, v)
	}
	return h, nil
}

// ServeHTTP runs one request through the filter chain and the router.
func (h *Host) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.closed.Load() {
		http.Error(w, "wasmhost: closed", http.StatusServiceUnavailable)
		return
	}
	h.serveStream(w, r)
}

// Serve accepts HTTP connections on l until Close. It returns
// http.ErrServerClosed after Close.
func (h *Host) Serve(l net.Listener) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second}
	h.srvMu.Lock()
	if h.closed.Load() {
		h.srvMu.Unlock()
		l.Close()
		return http.ErrServerClosed
	}
	h.servers = append(h.servers, srv)
	h.srvMu.Unlock()
	return srv.Serve(l)
}

// Close stops the listeners, the timers and the VMs. In-flight streams are
// reset.
func (h *Host) Close() error {
	if h.closed.Swap(true) {
		return nil
	}
	h.srvMu.Lock()
	for _, s := range h.servers {
		s.Close()
	}
	h.srvMu.Unlock()
	close(h.done)
	for _, v := range h.vms {
		v.mu.Lock()
	}
	var err error
	if h.runtime != nil {
		err = h.runtime.Close(context.Background())
	}
	for _, v := range h.vms {
		v.failed.Store(true)
		v.mu.Unlock()
	}
	h.transport.CloseIdleConnections()
	return err
}

// Readers for tests, the demo and benchmarks.

// Config returns the configuration in effect, defaults filled in.
func (h *Host) Config() Config { return h.cfg }

// Metrics returns every metric the module defined, sorted by name.
func (h *Host) Metrics() []Metric { return h.metrics.snapshot() }

// Metric returns the metric named name (summed over workers, as in Envoy).
func (h *Host) Metric(name string) (Metric, bool) { return h.metrics.lookup(name) }

// CounterValue returns a counter's or gauge's value, 0 if undefined.
func (h *Host) CounterValue(name string) int64 {
	m, _ := h.metrics.lookup(name)
	return m.Value
}

// Logs returns the recorded log lines, oldest first.
func (h *Host) Logs() []LogEntry { return h.logs.snapshot() }

// LogsContaining returns the log lines whose message contains substr.
func (h *Host) LogsContaining(substr string) []LogEntry { return h.logs.matching(substr) }

// SharedData reads a shared-data key of the host's vm_id: the value, its
// CAS, and whether it exists.
func (h *Host) SharedData(key string) ([]byte, uint32, bool) {
	v, cas, st := h.shared.get(h.cfg.VMID, key)
	return v, cas, st == StatusOK
}

// SetSharedData writes a shared-data key with the ABI's CAS rules (cas 0
// sets unconditionally). It returns ErrCasMismatch on a stale cas.
func (h *Host) SetSharedData(key string, value []byte, cas uint32) error {
	if st := h.shared.set(h.cfg.VMID, key, value, cas); st != StatusOK {
		return ErrCasMismatch
	}
	return nil
}

// SharedDataKeys lists the shared-data keys of the host's vm_id, sorted.
func (h *Host) SharedDataKeys() []string { return h.shared.keys(h.cfg.VMID) }

// Enqueue pushes data onto the shared queue name of the host's vm_id, as
// another VM would, and triggers on_queue_ready on the registering root
// context. It fails when no VM registered the queue.
func (h *Host) Enqueue(name string, data []byte) error {
	tok := h.queues.resolve(h.cfg.VMID, name)
	if tok == 0 {
		return fmt.Errorf("wasmhost: no shared queue %q registered in vm_id %q", name, h.cfg.VMID)
	}
	owner, rootID, _ := h.queues.enqueue(tok, data)
	h.notifyQueue(owner, rootID, tok)
	return nil
}

func (h *Host) notifyQueue(owner *vm, rootID uint32, tok uint32) {
	if owner == nil {
		return
	}
	go func() {
		owner.mu.Lock()
		root := owner.contexts[rootID]
		owner.mu.Unlock()
		if root != nil {
			owner.call(root, "proxy_on_queue_ready", owner.fn.onQueueReady, uint64(rootID), uint64(tok))
		}
	}()
}

// FireTicks calls on_tick now on every root context that set a tick
// period, on every live VM, for tests that should not wait for timers.
func (h *Host) FireTicks() {
	for _, v := range h.vms {
		v.mu.Lock()
		var roots []*wctx
		for _, r := range v.roots {
			if r.tickPeriod > 0 {
				roots = append(roots, r)
			}
		}
		v.mu.Unlock()
		for _, r := range roots {
			v.call(r, "proxy_on_tick", v.fn.onTick, uint64(r.id))
		}
	}
}

// WorkerStatus describes one VM.
type WorkerStatus struct {
	Index    int
	Failed   bool  // the VM trapped; its requests follow FailOpen
	Requests int64 // streams assigned to this worker so far
}

// Workers reports each VM's state.
func (h *Host) Workers() []WorkerStatus {
	out := make([]WorkerStatus, len(h.vms))
	for i, v := range h.vms {
		out[i] = WorkerStatus{Index: i, Failed: v.failed.Load(), Requests: v.streams.Load()}
	}
	return out
}

// VMFailures counts VMs that trapped. FailClosedReplies counts 503s sent
// because of a failed VM.
func (h *Host) VMFailures() int64        { return h.vmFailures.Load() }
func (h *Host) FailClosedReplies() int64 { return h.failClosedReplies.Load() }

func (h *Host) countUpstream(addr string) {
	h.upMu.Lock()
	h.upRequests[addr]++
	h.upMu.Unlock()
}

// UpstreamRequests returns how many requests (including HTTP calls) each
// upstream address received a response for.
func (h *Host) UpstreamRequests() map[string]int {
	h.upMu.Lock()
	defer h.upMu.Unlock()
	out := make(map[string]int, len(h.upRequests))
	for k, v := range h.upRequests {
		out[k] = v
	}
	return out
}

// CallStat counts the calls of one callback into the module (Kind
// "callback", e.g. "proxy_on_request_body") or of one host function the
// module called (Kind "host", e.g. "proxy_get_buffer_bytes"), over every VM,
// and the host's requests for module memory (Kind "memory", name
// "proxy_on_memory_allocate": one per host call that returns bytes). Total
// is wall time; a callback's includes the host calls it made, and a host
// call's the allocation it asked for.
type CallStat struct {
	Name  string
	Kind  string
	Count int64
	Total time.Duration
	// CPU is, for a callback, the CPU time its thread used (Linux; zero
	// elsewhere): steadier than Total on a machine whose cores other
	// processes share.
	CPU time.Duration
}

// CallStats returns the call counts and times so far, callbacks first, for
// profiling a filter: which callbacks run how often, which host calls they
// make and where the time goes.
func (h *Host) CallStats() []CallStat { return h.calls.snapshot() }

// Clusters returns the configured cluster names, sorted.
func (h *Host) Clusters() []string {
	names := make([]string, 0, len(h.clusters))
	for n := range h.clusters {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
