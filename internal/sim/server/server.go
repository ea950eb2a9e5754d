// Package server serves simulated vLLM engines over real HTTP on
// loopback, so that the Wasm filter, the cluster-metrics service and the
// demo can be tested end to end without a GPU.
//
// Each server runs one sim.Engine in scaled real time and speaks enough of
// vLLM's OpenAI-compatible API to be routed to:
//
//   - POST /v1/completions and /v1/chat/completions, streamed (SSE) or not,
//     with usage.prompt_tokens_details.cached_tokens from the engine's prefix
//     cache;
//   - GET /metrics in Prometheus text format with vLLM's metric names;
//   - the ORCA endpoint-load-metrics response header when the request asks
//     for it with endpoint-load-metrics-format (TEXT or JSON, as vLLM);
//   - disaggregated prefill/decode the way vLLM's NixlConnector does it
//     (kv_transfer_params) and SGLang's bootstrap pairing
//     (bootstrap_host/bootstrap_port/bootstrap_room);
//   - vLLM-style error bodies for bad requests;
//   - GET /health and /v1/models.
//
// The Go API:
//
//	f, err := server.Start(server.Options{Replicas: 4, TimeScale: 0.05})
//	defer f.Close()
//	for _, addr := range f.Addrs() { ... }  // "127.0.0.1:port"
//	f.Servers[0].Stats()                     // engine state (queue, KV, hits)
//
// The tokenizer is sim.CharsPerToken bytes per token, and generated text is
// pseudo-text. Prompt text is hashed into blocks and never stored or logged.
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/metricsvc/kvevents"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/snapshot"
)

// Options configures a set of simulated engines.
type Options struct {
	// Replicas is the number of servers (default 1).
	Replicas int
	// Host is the listen address (default 127.0.0.1: loopback only).
	Host string
	// PortBase is the first port; server i listens on PortBase+i. 0 picks
	// free ports.
	PortBase int
	// Role is "both" (default), "prefill" or "decode" for every server;
	// Roles, when set, gives one role per server instead.
	Role  string
	Roles []string
	// TimeScale is wall-clock seconds per simulated second: 1 runs the
	// engine in real time, 0.01 a hundred times faster, 0 without any
	// waiting. Default 1.
	TimeScale float64
	// TimeScaleSet makes a zero TimeScale mean "no waiting" rather than the
	// default.
	TimeScaleSet bool
	// Profile names the engine cost profile (default sim.DefaultProfile).
	Profile string
	// KVBlocks, if > 0, overrides the profile's KV capacity in blocks
	// (small caches make eviction visible in short tests).
	KVBlocks int
	// Model is the served model name (default "llama-3-8b").
	Model string
	// MaxModelLen is the context limit in tokens (default 131072).
	MaxModelLen int
	// KVEvents makes every server publish its prefix cache's changes as
	// vLLM's engines do (a ZMQ PUB socket on Host, at
	// Server.KVEventsEndpoint; the map layout on even replicas, the array
	// layout on odd ones), for `kvroute metrics` to follow.
	KVEvents bool
	// KVTransferBandwidth is bytes/s for prefill-to-decode KV transfer
	// (default 50e9, a 400 Gb/s RDMA NIC).
	KVTransferBandwidth float64
}

// Fleet is a set of running servers.
type Fleet struct {
	Servers []*Server
}

// Server is one simulated engine replica.
type Server struct {
	// Addr is host:port.
	Addr string
	// Role is "both", "prefill" or "decode".
	Role string
	// KVEventsEndpoint is where the engine publishes its KV events
	// (Options.KVEvents; "" when it does not).
	KVEventsEndpoint string

	opt      Options
	prof     sim.Profile
	engine   *liveEngine
	http     *http.Server
	ln       net.Listener
	engineID string
	seq      atomic.Uint64
	rooms    rooms
	client   *http.Client
	wg       sync.WaitGroup
	closed   sync.Once
	closeErr error
}

// Start launches the servers and returns once all of them accept
// connections. On error, servers already started are stopped.
func Start(opt Options) (*Fleet, error) {
	if opt.Replicas <= 0 {
		opt.Replicas = 1
	}
	if opt.Host == "" {
		opt.Host = "127.0.0.1"
	}
	if opt.TimeScale == 0 && !opt.TimeScaleSet {
		opt.TimeScale = 1
	}
	if opt.TimeScale < 0 {
		return nil, fmt.Errorf("time scale must not be negative, got %g", opt.TimeScale)
	}
	if opt.Model == "" {
		opt.Model = "llama-3-8b"
	}
	if opt.MaxModelLen <= 0 {
		opt.MaxModelLen = 131072
	}
	if opt.KVTransferBandwidth <= 0 {
		opt.KVTransferBandwidth = 50e9
	}
	if opt.Roles != nil && len(opt.Roles) != opt.Replicas {
		return nil, fmt.Errorf("%d roles given for %d replicas", len(opt.Roles), opt.Replicas)
	}
	prof, err := sim.LookupProfile(opt.Profile)
	if err != nil {
		return nil, err
	}
	if opt.KVBlocks > 0 {
		prof.NumGPUBlocksOverride = opt.KVBlocks
	}
	f := &Fleet{}
	for i := range opt.Replicas {
		role := opt.Role
		if opt.Roles != nil {
			role = opt.Roles[i]
		}
		role, err := snapshot.CheckRole(role)
		if err != nil {
			f.Close()
			return nil, err
		}
		port := 0
		if opt.PortBase > 0 {
			port = opt.PortBase + i
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(opt.Host, strconv.Itoa(port)))
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("replica %d: %w (pick another --port-base)", i, err)
		}
		var pub *kvPublisher
		if opt.KVEvents {
			layout := kvevents.MapLayout
			if i%2 == 1 {
				layout = kvevents.ArrayLayout
			}
			if pub, err = newKVPublisher(opt.Host, layout); err != nil {
				ln.Close()
				f.Close()
				return nil, fmt.Errorf("replica %d: KV events: %w", i, err)
			}
		}
		s := &Server{
			Addr: ln.Addr().String(), Role: role, opt: opt, prof: prof, ln: ln,
			engine:   newLiveEngine(prof, opt.TimeScale, pub),
			engineID: fmt.Sprintf("sim-engine-%d-%d", i, time.Now().UnixNano()),
			client:   &http.Client{Timeout: 2 * time.Minute},
		}
		s.rooms.m = map[uint64]*room{}
		s.http = &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.http.Serve(ln)
		}()
		if pub != nil {
			s.KVEventsEndpoint = pub.endpoint()
		}
		f.Servers = append(f.Servers, s)
	}
	return f, nil
}

// Addrs returns every server's host:port, in order.
func (f *Fleet) Addrs() []string {
	out := make([]string, len(f.Servers))
	for i, s := range f.Servers {
		out[i] = s.Addr
	}
	return out
}

// Close stops every server, dropping requests in flight.
func (f *Fleet) Close() error {
	var errs []error
	for _, s := range f.Servers {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// Close stops the server. It is idempotent: a test that kills one replica
// may still Close the whole fleet.
func (s *Server) Close() error {
	s.closed.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := s.http.Shutdown(ctx)
		if err != nil {
			err = s.http.Close()
		}
		s.engine.close()
		s.wg.Wait()
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.closeErr = err
	})
	return s.closeErr
}

// Stats returns the engine's current state and counters.
func (s *Server) Stats() sim.Stats { return s.engine.stats() }

// Profile is the engine's cost model.
func (s *Server) Profile() sim.Profile { return s.prof }

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/completions", s.handleCompletions)
	mux.HandleFunc("/v1/chat/completions", s.handleChat)
	mux.HandleFunc("/metrics", s.handleMetrics)
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/v1/models", s.handleModels)
	mux.HandleFunc(bootstrapPath, s.handleBootstrap)
	return mux
}
