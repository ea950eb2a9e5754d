// Package config parses and validates kvroute's plugin configuration: the JSON
// given to the Wasm filter as its plugin configuration (Envoy's
// `configuration`, Istio's `pluginConfig`).
//
// It imports no proxy-wasm SDK, so the same code runs inside the filter (at
// plugin start) and natively in tools: the manifest checks validate every
// shipped manifest's embedded configuration with Parse, and `kvroute` commands
// can lint a configuration before it reaches a gateway.
//
// Parsing walks the document with gjson instead of unmarshalling into structs:
// every error then names its exact field path (`endpoints[1].address: ...`),
// unknown keys are rejected (a misspelt key would otherwise silently keep its
// default), and the Wasm module carries no reflection-based decoder.
//
// It is the one schema and the one parser of the document, the decision
// layer's keys included (routing.go): package scorer builds the strategy
// from the parsed Config (scorer.Build) and reads plugin parameters through
// Params, so every mistake, wherever it is found, is an Error with its path.
//
// The top-level keys `endpoints`, `strategy` and `destinationHeader` are stable:
// tools outside the project rely on them. Add keys; never rename one.
package config

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/snapshot"
)

// Defaults. They are also what docs/configuration.md lists.
const (
	DefaultDestinationHeader = "x-gateway-destination-endpoint"
	DefaultStrategy          = "kv_cache_aware"
	DefaultStatePath         = "/.kvroute/v1/state"
	DefaultMaxBodyBytes      = 4 << 20
	DefaultFallbacks         = 2
	DefaultStaleAfterMs      = 10_000
	DefaultBreakerFailures   = 5
	DefaultBreakerCooldownMs = 10_000
	DefaultSessionHeader     = "x-session-id"
	DefaultDebugHeader       = "x-kvroute-debug"
	// MaxFallbacks bounds the destination header's comma list.
	MaxFallbacks = 8
)

// DefaultInferencePaths are the request paths the router decides for.
var DefaultInferencePaths = []string{"/v1/completions", "/v1/chat/completions", "/v1/embeddings"}

// Config is a validated plugin configuration with every default applied.
type Config struct {
	// Endpoints is the static candidate set, used until (and unless) the
	// cluster-metrics service pushes state.
	Endpoints []Endpoint
	// Strategy names a preset or a profile under "profiles".
	Strategy string
	// Plugins, Profiles (in name order) and Disaggregation are the rest
	// of the decision layer's keys (routing.go): Parse checks their shape,
	// scorer.Build resolves them into the strategy's handler.
	Plugins        []PluginSpec
	Profiles       []ProfileSpec
	Disaggregation *DisaggregationSpec
	// DestinationHeader is the header Envoy's override_host policy reads
	// (lower case). Client-supplied values are always removed.
	DestinationHeader string
	// Fallbacks is how many hosts follow the primary in the destination
	// header, for override_host retries.
	Fallbacks int

	// InferencePaths are the paths routed on their body; others are untouched
	// unless RejectOtherPaths.
	InferencePaths   []string
	RejectOtherPaths bool
	// BodyRouting false is the header-only mode (no
	// allow_on_headers_stop_iteration): no prompt, so no prefix affinity.
	BodyRouting bool
	// MaxBodyBytes is the largest request body the router buffers; larger
	// ones get 413.
	MaxBodyBytes int
	// SessionHeader carries a session id for affinity when the body has no
	// "user"; PrefixKeyHeader optionally carries a client-computed prefix key
	// (header-only mode). Empty disables.
	SessionHeader   string
	PrefixKeyHeader string
	// LoRAAdapters maps a requested model name that is a LoRA adapter to its
	// base model.
	LoRAAdapters map[string]string
	// ModelsAnswer says who answers GET /v1/models: ModelsLocal (the
	// filter, from the models the pushed state or the static endpoints
	// serve), ModelsPassthrough (an engine), or ModelsAuto (the default:
	// local when some endpoint names its model, else an engine).
	ModelsAnswer string

	State          State
	CircuitBreaker CircuitBreaker
	// ORCA asks upstreams for endpoint-load-metrics and reads it back.
	ORCA bool
	// StreamUsage says when a streamed response can carry the engine's
	// usage (and so its cached_tokens report): StreamUsageRequested (the
	// default) when the request asked for it with stream_options, as vLLM
	// and SGLang do by default; StreamUsageAlways when the engines add it
	// to every stream (vLLM's --enable-force-include-usage). The router
	// reads a streamed response's chunks only when usage can be in them:
	// otherwise a stream of a thousand tokens is a thousand body reads
	// for nothing.
	StreamUsage string
	// DebugHeader, when non-empty, adds a response header with the decision
	// explanation (never prompt text). Off by default.
	DebugHeader string

	// TestHooks enables the x-kvroute-test-panic request header used by the
	// Wasm integration tests. Never enable it in production.
	TestHooks bool

	// PD configures the kvroute.pd filter (config/pd.go).
	PD PD

	// Admission holds requests while every engine is saturated
	// (config/admission.go, admission).
	Admission admission.Config
}

// Endpoint is one static upstream.
type Endpoint struct {
	Address string // host:port as Envoy's cluster knows it
	Role    string // snapshot.RoleBoth, RolePrefill or RoleDecode
	Model   string // served model; empty matches any request
	// DataParallelSize is how many data-parallel ranks the endpoint serves,
	// each with its own KV cache (vLLM --data-parallel-size, SGLang
	// --dp-size): each rank is a cache location of its own, chosen with
	// the x-data-parallel-rank header. 0 or 1: one.
	DataParallelSize int
}

// State configures the state endpoint the cluster-metrics service pushes to.
type State struct {
	// Path of the state endpoint (POST). Requests to it never reach an upstream.
	Path string
	// Token is the bearer token a push must carry. Empty (and no TokenFile)
	// disables the endpoint: every push gets 401.
	Token string
	// TokenEnv names an environment variable of the Wasm VM holding the
	// token, so the secret stays out of the plugin configuration. Envoy's Wasm
	// VMs cannot read files; pass the variable with vm_config's
	// environment_variables (host_env_keys), which Kubernetes can fill from a
	// Secret.
	TokenEnv string
	// StaleAfterMs: pushed state older than this is not used for scoring.
	StaleAfterMs int
	// Pull, when its Cluster is set, has the router fetch the snapshot
	// itself: header-only mode cannot take pushes (Envoy forwards a
	// request's headers before the filter sees its body).
	Pull StatePull
	// Report, when its Cluster is set, has every worker POST its recent
	// routing and the gateway's load to the metrics service on its tick,
	// with the state token (docs/topology.md).
	Report Report
}

// StatePull configures fetching the fleet snapshot from the metrics
// service (its GET /state) with dispatch_http_call, from each worker's tick.
type StatePull struct {
	// Cluster is the Envoy cluster of the metrics service ("" disables).
	Cluster string
	// Path and Authority of the request (defaults /state and the cluster
	// name).
	Path, Authority string
	// IntervalMs between pulls (default 1000; the tick is 1 s unless
	// admission's is faster) and TimeoutMs of one.
	IntervalMs, TimeoutMs int
}

// Pull defaults.
const (
	DefaultPullPath       = "/state"
	DefaultPullIntervalMs = 1000
	DefaultPullTimeoutMs  = 2000
)

// Report configures the gateway's routing reports to the metrics service.
type Report struct {
	// Cluster is the Envoy cluster of the metrics service ("" disables).
	Cluster string
	// Path (default /v1/reports) and Authority (default: Cluster) of the POST.
	Path, Authority string
	// IntervalMs is how often each worker reports (default 50).
	IntervalMs int
}

// DefaultReportPath is where `kvroute metrics` takes gateway reports.
const DefaultReportPath = "/v1/reports"

// CircuitBreaker configures per-host circuit breaking.
type CircuitBreaker struct {
	// ConsecutiveFailures (5xx or connect failures) that open the breaker;
	// 0 disables.
	ConsecutiveFailures int
	// LatencyThresholdMs: a response slower than this counts as a failure;
	// 0 disables.
	LatencyThresholdMs int
	// CooldownMs before a half-open probe is let through.
	CooldownMs int
}

// Error is one configuration mistake, located by its path in the document.
type Error struct {
	Path string // "profiles.default.scorers[2].weight"; empty for the document itself
	Msg  string // "must be >= 0"
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Errors is every problem found in one configuration, in document order
// (Parse's, then scorer.Build's), so an operator fixes them all in one go.
type Errors []*Error

func (es Errors) Error() string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.Error()
	}
	return strings.Join(s, "; ")
}

// Parse validates data and returns the configuration with defaults applied.
// Empty input (or only whitespace) is the all-defaults configuration. On error
// it returns Errors, which names every bad field.
func Parse(data []byte) (*Config, error) {
	c := defaults()
	if len(strings.TrimSpace(string(data))) == 0 {
		return c, nil
	}
	if !gjson.ValidBytes(data) {
		return nil, Errors{{Msg: "not valid JSON (check quotes, commas and brackets)"}}
	}
	root := gjson.ParseBytes(data)
	if !root.IsObject() {
		return nil, Errors{{Msg: "the configuration must be a JSON object, got " + kind(root)}}
	}
	p := &parser{}
	p.object(root, "", map[string]func(gjson.Result, string){
		"endpoints":         func(v gjson.Result, path string) { c.Endpoints = p.endpoints(v, path) },
		"strategy":          func(v gjson.Result, path string) { c.Strategy = p.nonEmptyString(v, path) },
		"profiles":          func(v gjson.Result, path string) { c.Profiles = p.profiles(v, path) },
		"plugins":           func(v gjson.Result, path string) { c.Plugins = p.plugins(v, path) },
		"disaggregation":    func(v gjson.Result, path string) { c.Disaggregation = p.disaggregation(v, path) },
		"destinationHeader": func(v gjson.Result, path string) { c.DestinationHeader = p.headerName(v, path) },
		"fallbacks":         func(v gjson.Result, path string) { c.Fallbacks = p.intRange(v, path, 0, MaxFallbacks) },
		"inferencePaths":    func(v gjson.Result, path string) { c.InferencePaths = p.paths(v, path) },
		"rejectOtherPaths":  func(v gjson.Result, path string) { c.RejectOtherPaths = p.boolean(v, path) },
		"bodyRouting":       func(v gjson.Result, path string) { c.BodyRouting = p.boolean(v, path) },
		"maxBodyBytes":      func(v gjson.Result, path string) { c.MaxBodyBytes = p.intRange(v, path, 1, 1<<30) },
		"sessionHeader":     func(v gjson.Result, path string) { c.SessionHeader = p.optionalHeaderName(v, path) },
		"prefixKeyHeader":   func(v gjson.Result, path string) { c.PrefixKeyHeader = p.optionalHeaderName(v, path) },
		"loraAdapters":      func(v gjson.Result, path string) { c.LoRAAdapters = p.stringMap(v, path) },
		"models":            func(v gjson.Result, path string) { c.ModelsAnswer = p.models(v, path) },
		"state":             func(v gjson.Result, path string) { p.state(v, path, &c.State) },
		"circuitBreaker":    func(v gjson.Result, path string) { p.breaker(v, path, &c.CircuitBreaker) },
		"orca":              func(v gjson.Result, path string) { c.ORCA = p.boolean(v, path) },
		"streamUsage":       func(v gjson.Result, path string) { c.StreamUsage = p.streamUsage(v, path) },
		"debugHeader":       func(v gjson.Result, path string) { c.DebugHeader = p.optionalHeaderName(v, path) },
		"testHooks":         func(v gjson.Result, path string) { c.TestHooks = p.boolean(v, path) },
		"pd":                func(v gjson.Result, path string) { c.PD = p.pd(v, path) },
		"admission":         func(v gjson.Result, path string) { c.Admission = p.admissionCfg(v, path) },
	})
	p.crossChecks(c)
	if len(p.errs) > 0 {
		return nil, p.errs
	}
	return c, nil
}

func defaults() *Config {
	return &Config{
		Strategy:          DefaultStrategy,
		DestinationHeader: DefaultDestinationHeader,
		Fallbacks:         DefaultFallbacks,
		InferencePaths:    append([]string(nil), DefaultInferencePaths...),
		BodyRouting:       true,
		MaxBodyBytes:      DefaultMaxBodyBytes,
		SessionHeader:     DefaultSessionHeader,
		StreamUsage:       StreamUsageRequested,
		ModelsAnswer:      ModelsAuto,
		State:             State{Path: DefaultStatePath, StaleAfterMs: DefaultStaleAfterMs},
		CircuitBreaker:    CircuitBreaker{ConsecutiveFailures: DefaultBreakerFailures, CooldownMs: DefaultBreakerCooldownMs},
		PD:                defaultPD(),
		Admission:         admission.Defaults(),
	}
}

type parser struct{ errs Errors }

func (p *parser) fail(path, format string, args ...any) { p.errs.Add(path, format, args...) }

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// object walks an object's keys in document order, rejecting unknown and
// duplicate keys. Not inlined: each of its twenty callers would carry a
// copy of the walk (1.6 KB of Wasm each).
//
//go:noinline
func (p *parser) object(v gjson.Result, path string, fields map[string]func(gjson.Result, string)) {
	seen := map[string]bool{}
	v.ForEach(func(k, val gjson.Result) bool {
		key := k.String()
		fp := join(path, key)
		fn, ok := fields[key]
		switch {
		case !ok:
			p.fail(fp, "unknown key (known keys: %s)", strings.Join(sortedKeys(fields), ", "))
		case seen[key]:
			p.fail(fp, "given twice")
		default:
			fn(val, fp)
		}
		seen[key] = true
		return true
	})
}

func sortedKeys(m map[string]func(gjson.Result, string)) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func kind(v gjson.Result) string {
	switch {
	case v.IsObject():
		return "an object"
	case v.IsArray():
		return "an array"
	case v.Type == gjson.String:
		return "a string"
	case v.Type == gjson.Number:
		return "a number"
	case v.Type == gjson.True || v.Type == gjson.False:
		return "a boolean"
	case v.Type == gjson.Null:
		return "null"
	}
	return "nothing"
}

func (p *parser) str(v gjson.Result, path string) (string, bool) {
	if v.Type != gjson.String {
		p.fail(path, "must be a string, got %s", kind(v))
		return "", false
	}
	return v.Str, true
}

func (p *parser) nonEmptyString(v gjson.Result, path string) string {
	s, ok := p.str(v, path)
	if ok && strings.TrimSpace(s) == "" {
		p.fail(path, "must not be empty")
	}
	return s
}

func (p *parser) boolean(v gjson.Result, path string) bool {
	if v.Type != gjson.True && v.Type != gjson.False {
		p.fail(path, "must be true or false, got %s", kind(v))
		return false
	}
	return v.Bool()
}

func (p *parser) intRange(v gjson.Result, path string, lo, hi int) int {
	if v.Type != gjson.Number {
		p.fail(path, "must be a number, got %s", kind(v))
		return 0
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	if err != nil {
		p.fail(path, "must be a whole number, got %s", v.Raw)
		return 0
	}
	if n < int64(lo) || n > int64(hi) {
		p.fail(path, "must be between %d and %d, got %d", lo, hi, n)
		return 0
	}
	return int(n)
}

func (p *parser) stringMap(v gjson.Result, path string) map[string]string {
	if !v.IsObject() {
		p.fail(path, "must be an object of strings, got %s", kind(v))
		return nil
	}
	m := map[string]string{}
	v.ForEach(func(k, val gjson.Result) bool {
		fp := join(path, k.String())
		if s := p.nonEmptyString(val, fp); s != "" {
			m[k.String()] = s
		}
		return true
	})
	return m
}

// headerName accepts an HTTP header name. Envoy keeps header names in lower
// case, so an upper-case name would never match: it is refused, not folded.
func (p *parser) headerName(v gjson.Result, path string) string {
	s, ok := p.str(v, path)
	if !ok {
		return ""
	}
	if s == "" {
		p.fail(path, "must not be empty")
		return ""
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		case c >= 'A' && c <= 'Z':
			p.fail(path, "%q: header names must be lower case (Envoy lower-cases them), use %q", s, strings.ToLower(s))
			return ""
		default:
			p.fail(path, "%q is not a valid header name (letters, digits, '-', '_', '.')", s)
			return ""
		}
	}
	if s[0] == ':' {
		p.fail(path, "%q: pseudo-headers cannot be used", s)
	}
	return s
}

func (p *parser) optionalHeaderName(v gjson.Result, path string) string {
	if v.Type == gjson.String && v.Str == "" {
		return ""
	}
	return p.headerName(v, path)
}

func (p *parser) paths(v gjson.Result, path string) []string {
	if !v.IsArray() {
		p.fail(path, "must be an array of paths, got %s", kind(v))
		return nil
	}
	var out []string
	for i, e := range v.Array() {
		fp := fmt.Sprintf("%s[%d]", path, i)
		s, ok := p.str(e, fp)
		if !ok {
			continue
		}
		if !strings.HasPrefix(s, "/") {
			p.fail(fp, "%q must start with '/'", s)
			continue
		}
		out = append(out, s)
	}
	return out
}

func (p *parser) endpoints(v gjson.Result, path string) []Endpoint {
	if !v.IsArray() {
		p.fail(path, "must be an array of {\"address\": \"host:port\"} objects, got %s", kind(v))
		return nil
	}
	var out []Endpoint
	seen := map[string]int{}
	for i, e := range v.Array() {
		ep := fmt.Sprintf("%s[%d]", path, i)
		if !e.IsObject() {
			p.fail(ep, "must be an object like {\"address\": \"10.0.0.7:8000\"}, got %s", kind(e))
			continue
		}
		end := Endpoint{Role: snapshot.RoleBoth}
		p.object(e, ep, map[string]func(gjson.Result, string){
			"address": func(v gjson.Result, fp string) { end.Address = p.address(v, fp) },
			"role":    func(v gjson.Result, fp string) { end.Role = p.role(v, fp) },
			"model":   func(v gjson.Result, fp string) { end.Model, _ = p.str(v, fp) },
			"dataParallelSize": func(v gjson.Result, fp string) {
				end.DataParallelSize = p.dataParallelSize(v, fp)
			},
		})
		if !e.Get("address").Exists() {
			p.fail(ep+".address", "is required (host:port, as Envoy's cluster knows the endpoint)")
			continue
		}
		if end.Address == "" {
			continue
		}
		if j, dup := seen[end.Address]; dup {
			p.fail(ep+".address", "%q is already endpoints[%d]", end.Address, j)
			continue
		}
		seen[end.Address] = i
		out = append(out, end)
	}
	return out
}

// dataParallelSize accepts 1..snapshot.MaxDataParallelSize.
func (p *parser) dataParallelSize(v gjson.Result, path string) int {
	if v.Type != gjson.Number || v.Num != float64(int(v.Num)) || v.Num < 1 || v.Num > snapshot.MaxDataParallelSize {
		p.fail(path, "must be a whole number of data-parallel ranks from 1 to %d (the engine's --data-parallel-size), got %s", snapshot.MaxDataParallelSize, v.Raw)
		return 0
	}
	return int(v.Num)
}

// address accepts host:port as the state contract does
// (snapshot.CheckAddress): an endpoint and a pushed host are one kind of
// address.
func (p *parser) address(v gjson.Result, path string) string {
	s, ok := p.str(v, path)
	if !ok {
		return ""
	}
	if err := snapshot.CheckAddress(s); err != nil {
		p.fail(path, "%v", err)
		return ""
	}
	return s
}

func (p *parser) role(v gjson.Result, path string) string {
	s, ok := p.str(v, path)
	if !ok {
		return snapshot.RoleBoth
	}
	role, err := snapshot.CheckRole(s)
	if err != nil {
		p.fail(path, "%v", err)
	}
	return role
}

// When a streamed response carries usage (Config.StreamUsage).
const (
	StreamUsageRequested = "requested"
	StreamUsageAlways    = "always"
)

func (p *parser) streamUsage(v gjson.Result, path string) string {
	s, ok := p.str(v, path)
	if !ok {
		return StreamUsageRequested
	}
	switch s {
	case StreamUsageRequested, StreamUsageAlways:
		return s
	}
	p.fail(path, "%q is not a stream usage mode: use \"requested\" (engines add usage to a stream when the request asks, the default) or \"always\" (vLLM's --enable-force-include-usage)", s)
	return StreamUsageRequested
}

// The answers to GET /v1/models (Config.ModelsAnswer).
const (
	ModelsAuto        = "auto"
	ModelsLocal       = "local"
	ModelsPassthrough = "passthrough"
)

// models parses {"answer": "auto"|"local"|"passthrough"}.
func (p *parser) models(v gjson.Result, path string) string {
	answer := ModelsAuto
	if !v.IsObject() {
		p.fail(path, "must be an object like {\"answer\": \"local\"}, got %s", kind(v))
		return answer
	}
	p.object(v, path, map[string]func(gjson.Result, string){
		"answer": func(v gjson.Result, fp string) {
			s, ok := p.str(v, fp)
			switch {
			case !ok:
			case s == ModelsAuto || s == ModelsLocal || s == ModelsPassthrough:
				answer = s
			default:
				p.fail(fp, "%q is not an answer: use \"local\" (the gateway lists the models its endpoints serve), \"passthrough\" (an engine answers) or \"auto\" (local when some endpoint names its model, the default)", s)
			}
		},
	})
	return answer
}

func (p *parser) state(v gjson.Result, path string, s *State) {
	if !v.IsObject() {
		p.fail(path, "must be an object, got %s", kind(v))
		return
	}
	p.object(v, path, map[string]func(gjson.Result, string){
		"path": func(v gjson.Result, fp string) {
			if ps := p.paths(gjson.Parse("["+v.Raw+"]"), fp); len(ps) == 1 {
				s.Path = ps[0]
			}
		},
		"token":        func(v gjson.Result, fp string) { s.Token, _ = p.str(v, fp) },
		"tokenEnv":     func(v gjson.Result, fp string) { s.TokenEnv = p.envName(v, fp) },
		"staleAfterMs": func(v gjson.Result, fp string) { s.StaleAfterMs = p.intRange(v, fp, 1, 24*3600*1000) },
		"pull":         func(v gjson.Result, fp string) { p.pull(v, fp, &s.Pull) },
		"report":       func(v gjson.Result, fp string) { p.report(v, fp, &s.Report) },
	})
	if s.Token != "" && s.TokenEnv != "" {
		p.fail(path, "give token or tokenEnv, not both")
	}
}

// pull parses state.pull: {"cluster": "...", "path": "/state",
// "authority": "...", "intervalMs": 1000, "timeoutMs": 2000}.
func (p *parser) pull(v gjson.Result, path string, sp *StatePull) {
	if !v.IsObject() {
		p.fail(path, "must be an object like {\"cluster\": \"kvroute_metrics\"}, got %s", kind(v))
		return
	}
	sp.Path, sp.IntervalMs, sp.TimeoutMs = DefaultPullPath, DefaultPullIntervalMs, DefaultPullTimeoutMs
	p.object(v, path, map[string]func(gjson.Result, string){
		"cluster":   func(v gjson.Result, fp string) { sp.Cluster = p.nonEmptyString(v, fp) },
		"authority": func(v gjson.Result, fp string) { sp.Authority = p.nonEmptyString(v, fp) },
		"path": func(v gjson.Result, fp string) {
			if ps := p.paths(gjson.Parse("["+v.Raw+"]"), fp); len(ps) == 1 {
				sp.Path = ps[0]
			}
		},
		"intervalMs": func(v gjson.Result, fp string) { sp.IntervalMs = p.intRange(v, fp, 100, 3600*1000) },
		"timeoutMs":  func(v gjson.Result, fp string) { sp.TimeoutMs = p.intRange(v, fp, 10, 60*1000) },
	})
	if sp.Cluster == "" {
		p.fail(join(path, "cluster"), "is required: the Envoy cluster of the metrics service (Istio: outbound|9090||kvroute-metrics.<namespace>.svc.cluster.local)")
	}
	if sp.Authority == "" {
		sp.Authority = sp.Cluster
	}
}

func (p *parser) report(v gjson.Result, path string, r *Report) {
	if !v.IsObject() {
		p.fail(path, "must be an object, got %s", kind(v))
		return
	}
	r.Path, r.IntervalMs = DefaultReportPath, 50
	p.object(v, path, map[string]func(gjson.Result, string){
		"cluster":   func(v gjson.Result, fp string) { r.Cluster, _ = p.str(v, fp) },
		"authority": func(v gjson.Result, fp string) { r.Authority, _ = p.str(v, fp) },
		"path": func(v gjson.Result, fp string) {
			if ps := p.paths(gjson.Parse("["+v.Raw+"]"), fp); len(ps) == 1 {
				r.Path = ps[0]
			}
		},
		"intervalMs": func(v gjson.Result, fp string) { r.IntervalMs = p.intRange(v, fp, 10, 10_000) },
	})
	if r.Cluster == "" {
		p.fail(path+".cluster", "name the Envoy cluster of the metrics service (reports go there with the state token)")
	}
	if r.Authority == "" {
		r.Authority = r.Cluster
	}
}

func (p *parser) breaker(v gjson.Result, path string, b *CircuitBreaker) {
	if !v.IsObject() {
		p.fail(path, "must be an object, got %s", kind(v))
		return
	}
	p.object(v, path, map[string]func(gjson.Result, string){
		"consecutiveFailures": func(v gjson.Result, fp string) { b.ConsecutiveFailures = p.intRange(v, fp, 0, 1000) },
		"latencyThresholdMs":  func(v gjson.Result, fp string) { b.LatencyThresholdMs = p.intRange(v, fp, 0, 3600*1000) },
		"cooldownMs":          func(v gjson.Result, fp string) { b.CooldownMs = p.intRange(v, fp, 1, 3600*1000) },
	})
}

// crossChecks are the rules that involve more than one field.
func (p *parser) crossChecks(c *Config) {
	for _, ip := range c.InferencePaths {
		if ip == c.State.Path {
			p.fail("state.path", "%q is also an inference path", ip)
		}
	}
	// The headers kvroute reads from the request must not be the one it
	// writes: the client's destination header is removed unread.
	for _, h := range []struct{ path, name string }{
		{"sessionHeader", c.SessionHeader}, {"prefixKeyHeader", c.PrefixKeyHeader},
		{"admission.priorityHeader", c.Admission.PriorityHeader}, {"admission.deadlineHeader", c.Admission.DeadlineHeader},
	} {
		if h.name != "" && strings.EqualFold(h.name, c.DestinationHeader) {
			p.fail(h.path, "%q is the destination header, which kvroute sets and removes from clients: name another header", h.name)
		}
	}
}

func (p *parser) envName(v gjson.Result, path string) string {
	s := p.nonEmptyString(v, path)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			p.fail(path, "%q is not an environment variable name", s)
			return ""
		}
	}
	return s
}
