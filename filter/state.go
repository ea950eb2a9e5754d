package filter

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/snapshot"
)

// The state endpoint: `kvroute metrics` POSTs a snapshot.State to every
// gateway. The worker that receives it validates it and stores the raw body
// in shared data; every worker reloads it when the generation key moves.
const (
	stateBodyKey = "kvroute/state/body"
	stateGenKey  = "kvroute/state/gen"
)

// maxCASAttempts bounds compare-and-set retries on the state keys.
const maxCASAttempts = 8

// pushedState is a decoded, validated snapshot.
type pushedState struct {
	TimestampMs int64
	Hosts       []snapshot.Host
	// Gateways are the gateways' routing reports (filter/report.go).
	Gateways []snapshot.GatewayReport
	// Removals are the engines' bridged evictions (filter/report.go).
	Removals []snapshot.Removal
	// Cursor is where a pulled state's routes and removals end in the
	// service's log: the next pull asks from there (filter/pull.go).
	Cursor string
}

// decodeSnapshot validates a pushed body. The error is the 400 message.
func decodeSnapshot(body []byte) (pushedState, error) {
	var st pushedState
	if len(body) == 0 {
		return st, errors.New("empty body: POST a kvroute state snapshot (JSON)")
	}
	if !gjson.ValidBytes(body) {
		return st, errors.New("the body is not valid JSON")
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return st, errors.New("the body must be a JSON object")
	}
	if v := root.Get("version"); v.Type != gjson.Number || v.Int() != snapshot.Version {
		return st, fmt.Errorf("version: must be %d (this gateway reads snapshot format %d)", snapshot.Version, snapshot.Version)
	}
	ts, ok := unixMs(root.Get("timestampMs"))
	if !ok || ts <= 0 {
		return st, errors.New("timestampMs: must be a positive whole Unix time in milliseconds")
	}
	st.TimestampMs = ts
	hosts := root.Get("hosts")
	if !hosts.IsArray() {
		return st, errors.New("hosts: must be an array")
	}
	seen := map[string]bool{}
	var err error
	i := 0
	hosts.ForEach(func(_, h gjson.Result) bool {
		var host snapshot.Host
		host, err = decodeHost(h, i)
		loc := host.Address
		if host.DataParallelSize > 1 {
			loc = rankLocation(loc, host.Rank)
		}
		if err == nil && seen[loc] {
			err = fmt.Errorf("hosts[%d].address: %q appears twice", i, loc)
		}
		if err != nil {
			return false
		}
		seen[loc] = true
		st.Hosts = append(st.Hosts, host)
		i++
		return true
	})
	if err != nil {
		return pushedState{}, err
	}
	if len(st.Hosts) == 0 {
		return pushedState{}, errors.New("hosts: must not be empty (a push replaces the candidate set; an empty one would leave nothing to route to)")
	}
	if g := root.Get("gateways"); g.Exists() && g.Type != gjson.Null {
		if st.Gateways, err = decodeGateways(g); err != nil {
			return pushedState{}, err
		}
	}
	if c := root.Get("cursor"); c.Exists() {
		if !validCursor(c) {
			return pushedState{}, errors.New("cursor: must be a string of at most 64 characters of [0-9A-Za-z._-]")
		}
		st.Cursor = c.Str
	}
	if r := root.Get("removals"); r.Exists() && r.Type != gjson.Null {
		if st.Removals, err = decodeRemovals(r); err != nil {
			return pushedState{}, err
		}
	}
	return st, nil
}

// validCursor accepts a pull cursor (snapshot.State.Cursor): it goes into
// the next pull's query string as it is.
func validCursor(c gjson.Result) bool {
	if c.Type != gjson.String || len(c.Str) > 64 {
		return false
	}
	for i := 0; i < len(c.Str); i++ {
		switch b := c.Str[i]; {
		case b >= '0' && b <= '9', b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b == '.', b == '_', b == '-':
		default:
			return false
		}
	}
	return true
}

// maxRemovalBlocks bounds one removal's chain (a prompt of a few million
// characters under the default block layout).
const maxRemovalBlocks = 1 << 16

// decodeRemovals validates a push's removals (snapshot.Removal): a host
// location (host:port, or host:port|rank for a data-parallel rank), a
// base64 chain of 8-byte hashes and a from inside it.
func decodeRemovals(r gjson.Result) ([]snapshot.Removal, error) {
	if !r.IsArray() {
		return nil, errors.New("removals: must be an array")
	}
	var out []snapshot.Removal
	var err error
	r.ForEach(func(_, x gjson.Result) bool {
		addr, chain := x.Get("address"), x.Get("chain")
		from, ok := snapshot.WholeNumber(x.Get("from"))
		blocks := -1
		if chain.Type == gjson.String {
			blocks = chainBlocks(chain.Str)
		}
		if !x.IsObject() || addr.Type != gjson.String || checkLocation(addr.Str) != nil ||
			blocks <= 0 || blocks > maxRemovalBlocks || !ok || from < 0 || from >= int64(blocks) {
			err = fmt.Errorf("removals[%d]: needs a host:port address, a base64 chain of 1 to %d 8-byte hashes and a from inside it", len(out), maxRemovalBlocks)
			return false
		}
		out = append(out, snapshot.Removal{Address: addr.Str, From: int(from), Chain: chain.Str})
		return true
	})
	return out, err
}

// chainBlocks is the number of 8-byte hashes a base64 (std, padded)
// chain holds, -1 when it is not one. The padded length alone does not
// say: 16 bytes encode to 24 characters, which DecodedLen puts at 18.
func chainBlocks(s string) int {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw)%8 != 0 {
		return -1
	}
	return len(raw) / 8
}

// decodeGateways validates a push's gateway reports (snapshot.GatewayReport).
func decodeGateways(g gjson.Result) ([]snapshot.GatewayReport, error) {
	if !g.IsArray() {
		return nil, errors.New("gateways: must be an array")
	}
	var out []snapshot.GatewayReport
	var err error
	g.ForEach(func(_, r gjson.Result) bool {
		at := "gateways[" + strconv.Itoa(len(out)) + "]"
		var rep snapshot.GatewayReport
		id := r.Get("gateway")
		if id.Type != gjson.String || id.Str == "" || len(id.Str) > 64 {
			err = fmt.Errorf("%s.gateway: must be an id of 1 to 64 characters", at)
			return false
		}
		rep.Gateway = id.Str
		rep.TimestampMs, _ = unixMs(r.Get("timestampMs"))
		r.Get("routes").ForEach(func(_, rt gjson.Result) bool {
			addr, chain, from := rt.Get("address"), rt.Get("chain"), rt.Get("from")
			n, ok := snapshot.WholeNumber(from)
			if !from.Exists() {
				n, ok = 0, true
			}
			if addr.Type != gjson.String || checkLocation(addr.Str) != nil || chain.Type != gjson.String ||
				!ok || n < 0 || n > 1<<20 || chain.Type == gjson.String && chainBlocks(chain.Str) < 0 {
				err = fmt.Errorf("%s.routes[%d]: needs a host:port address, a from >= 0 and a base64 chain of 8-byte hashes", at, len(rep.Routes))
				return false
			}
			pt, _ := snapshot.WholeNumber(rt.Get("promptTokens"))
			rep.Routes = append(rep.Routes, snapshot.Route{Address: addr.Str, From: int(n), Chain: chain.Str, PromptTokens: int(max(min(pt, 1<<30), 0))})
			return true
		})
		if err != nil {
			return false
		}
		if l := r.Get("load"); l.Exists() {
			rep.Load = []snapshot.HostLoad{}
			l.ForEach(func(_, x gjson.Result) bool {
				addr := x.Get("address")
				in, ok1 := snapshot.WholeNumber(x.Get("inFlight"))
				pf, ok2 := snapshot.WholeNumber(x.Get("prefillTokens"))
				dc, ok3 := snapshot.WholeNumber(x.Get("decodeTokens"))
				if addr.Type != gjson.String || !ok1 || !ok2 || !ok3 || in < 0 || pf < 0 || dc < 0 || in > 1<<31 {
					err = fmt.Errorf("%s.load[%d]: needs an address and whole counts >= 0", at, len(rep.Load))
					return false
				}
				rep.Load = append(rep.Load, snapshot.HostLoad{Address: addr.Str, InFlight: int(in), PrefillTokens: pf, DecodeTokens: dc})
				return true
			})
		}
		out = append(out, rep)
		return err == nil
	})
	return out, err
}

func decodeHost(h gjson.Result, i int) (snapshot.Host, error) {
	at := hostAt(i)
	var host snapshot.Host
	if !h.IsObject() {
		return host, fmt.Errorf("%s: must be an object", at)
	}
	var m objectMembers
	m.read(h)
	addr := m.get("address")
	if addr.Type != gjson.String {
		return host, fmt.Errorf("%s.address: must be a host:port string", at)
	}
	if err := snapshot.CheckAddress(addr.Str); err != nil {
		return host, fmt.Errorf("%s.address: %v", at, err)
	}
	host.Address = addr.Str
	role, err := snapshot.CheckRole(m.get("role").Str)
	if err != nil {
		return host, fmt.Errorf("%s.role: %v", at, err)
	}
	host.Role = role
	if m := m.get("model"); m.Exists() {
		if m.Type != gjson.String {
			return host, fmt.Errorf("%s.model: must be a string", at)
		}
		host.Model = m.Str
	}
	if a := m.get("adapters"); a.Exists() && a.Type != gjson.Null {
		if !a.IsArray() {
			return host, fmt.Errorf("%s.adapters: must be an array of strings", at)
		}
		for _, x := range a.Array() {
			if x.Type != gjson.String {
				return host, fmt.Errorf("%s.adapters: must be an array of strings", at)
			}
			host.Adapters = append(host.Adapters, x.Str)
		}
	}
	healthy := m.get("healthy")
	if healthy.Exists() && healthy.Type != gjson.True && healthy.Type != gjson.False {
		return host, fmt.Errorf("%s.healthy: must be a boolean", at)
	}
	host.Healthy = !healthy.Exists() || healthy.Bool()
	if v := m.get("preciseCacheState"); v.Exists() {
		if v.Type != gjson.True && v.Type != gjson.False {
			return host, fmt.Errorf("%s.preciseCacheState: must be a boolean", at)
		}
		host.PreciseCacheState = v.Type == gjson.True
	}
	ints := []struct {
		name string
		dst  *int
	}{{"waiting", &host.Waiting}, {"running", &host.Running}, {"blockSize", &host.BlockSize}, {"numGpuBlocks", &host.NumGPUBlocks}, {"cachedBlocks", &host.CachedBlocks},
		{"maxAdapters", &host.MaxAdapters}, {"adapterSlotsUsed", &host.AdapterSlotsUsed}}
	for _, f := range ints {
		v := m.get(f.name)
		if !v.Exists() {
			continue
		}
		n, ok := snapshot.WholeNumber(v)
		if !ok || n < 0 || n > 1<<40 {
			return host, fmt.Errorf("%s.%s: must be a whole number >= 0", at, f.name)
		}
		*f.dst = int(n)
	}
	if err := decodeRank(&m, &host, at); err != nil {
		return host, err
	}
	if v := m.get("kvUsage"); v.Exists() {
		if v.Type != gjson.Number || v.Num < 0 || v.Num > 1 {
			return host, fmt.Errorf("%s.kvUsage: must be a number from 0 to 1", at)
		}
		host.KVUsage = v.Num
	}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"clearedAtMs", &host.ClearedAtMs}, {"scrapedAtMs", &host.ScrapedAtMs}} {
		if v := m.get(f.name); v.Exists() {
			ms, ok := unixMs(v)
			if !ok || ms < 0 {
				return host, fmt.Errorf("%s.%s: must be a whole Unix time in milliseconds", at, f.name)
			}
			*f.dst = ms
		}
	}
	return host, nil
}

// checkLocation accepts a cache location as gateways report it: host:port,
// or host:port|rank for a data-parallel endpoint's rank (rankLocation).
func checkLocation(s string) error {
	addr, rank := splitRank(s)
	if _, ok := decimal(rank); rank != "" && (!ok || len(rank) > 2) {
		return fmt.Errorf("%q: the rank after | must be a number", s)
	}
	return snapshot.CheckAddress(addr)
}

// decodeRank reads a host's dataParallelSize and rank: a rank names one of
// the endpoint's ranks, so it needs a size above 1 and lies below it.
func decodeRank(m *objectMembers, host *snapshot.Host, at hostAt) error {
	if v := m.get("dataParallelSize"); v.Exists() {
		n, ok := snapshot.WholeNumber(v)
		if !ok || n < 1 || n > snapshot.MaxDataParallelSize {
			return fmt.Errorf("%s.dataParallelSize: must be a whole number from 1 to %d", at, snapshot.MaxDataParallelSize)
		}
		host.DataParallelSize = int(n)
	}
	v := m.get("rank")
	if !v.Exists() {
		return nil
	}
	n, ok := snapshot.WholeNumber(v)
	if !ok || n < 0 || n >= int64(max(host.DataParallelSize, 1)) {
		return fmt.Errorf("%s.rank: %s is not a rank of the endpoint's %d data-parallel ranks (0 to %d; set dataParallelSize)",
			at, v.Raw, max(host.DataParallelSize, 1), max(host.DataParallelSize, 1)-1)
	}
	host.Rank = int(n)
	return nil
}

// hostAt names hosts[i] in an error, formatted only when there is one.
type hostAt int

func (i hostAt) String() string { return "hosts[" + strconv.Itoa(int(i)) + "]" }

// objectMembers holds an object's members as read in one pass: a push carries
// about ten fields per host, and gjson's Get scans the object again for
// each, which made decoding a 1,000-host push several times slower.
type objectMembers struct {
	obj   gjson.Result
	n     int
	over  bool // more members than fit: get falls back to Get
	names [16]string
	vals  [16]gjson.Result
}

func (m *objectMembers) read(obj gjson.Result) {
	m.obj = obj
	obj.ForEach(func(k, v gjson.Result) bool {
		if m.n == len(m.names) {
			m.over = true
			return false
		}
		m.names[m.n], m.vals[m.n] = k.Str, v
		m.n++
		return true
	})
}

// get is Get on the object: the first member named name.
func (m *objectMembers) get(name string) gjson.Result {
	for i := 0; i < m.n; i++ {
		if m.names[i] == name {
			return m.vals[i]
		}
	}
	if m.over {
		return m.obj.Get(name)
	}
	return gjson.Result{}
}

// maxUnixMs bounds the timestamps a push may carry: 2^53 ms (year
// 287,396), the largest integer a JSON number holds exactly. Without a
// bound, 1e400 would read as the largest int64 and never go stale.
const maxUnixMs = 1 << 53

// unixMs reads a Unix time in milliseconds: a JSON number that is whole
// and at most maxUnixMs (1.5 and 1e400 are refused, 1e12 is not).
func unixMs(v gjson.Result) (int64, bool) {
	// Bounded first (NaN fails the test too): a float beyond int64
	// converts to an implementation-defined integer.
	if v.Type != gjson.Number || !(math.Abs(v.Num) <= maxUnixMs) {
		return 0, false
	}
	return snapshot.WholeNumber(v)
}

// maxPushAheadMs is how far ahead of the gateway's clock a push may be
// stamped (clock skew between the metrics service and the gateway). A
// push stamped further ahead is refused: accepted, it would stay fresh
// past state.staleAfterMs and make every correctly stamped push until
// then look older than the state in force (409).
const maxPushAheadMs = 60_000

// bearerToken extracts the token of an "Authorization: Bearer <token>" value.
func bearerToken(v string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// authorized compares the presented token with the configured one in
// constant time. An empty configured token authorizes nothing.
func authorized(header, want string) bool {
	got, ok := bearerToken(header)
	if !ok || want == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// olderStateError refuses a push stamped before the state in force.
type olderStateError struct{ pushed, inForce int64 }

func (e *olderStateError) Error() string {
	return fmt.Sprintf("timestampMs %d is older than the state in force (timestampMs %d): this gateway keeps the newest snapshot; a metrics service whose clock runs behind must be fixed, not obeyed", e.pushed, e.inForce)
}

// storeState publishes a validated body stamped ts to every worker: the
// body first, then a bumped generation, so a worker that sees the new
// generation reads the new body. Returns the new generation.
//
// The body is replaced under CAS, after comparing stamps with the body in
// force: of two pushes racing on two workers, the older one is refused
// (olderStateError) whichever lands first. A push stamped like the one in
// force (the same snapshot sent again) is accepted.
func storeState(st *sharedStore, body []byte, ts int64) (uint64, error) {
	stored := false
	for attempt := 0; attempt < maxCASAttempts && !stored; attempt++ {
		cur, cas, err := st.Get(stateBodyKey)
		switch {
		case errors.Is(err, index.ErrNotFound):
			cas = createCAS
		case err != nil:
			return 0, err
		default:
			if inForce, ok := unixMs(gjson.GetBytes(cur, "timestampMs")); ok && ts < inForce {
				return 0, &olderStateError{pushed: ts, inForce: inForce}
			}
		}
		err = st.Set(stateBodyKey, body, cas)
		if err != nil && !errors.Is(err, index.ErrCASMismatch) {
			return 0, err
		}
		stored = err == nil
	}
	if !stored {
		return 0, errors.New("state body: too much contention")
	}
	var buf [8]byte
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		v, cas, err := proxywasm.GetSharedData(stateGenKey)
		var gen uint64
		if err == nil && len(v) == 8 {
			gen = binary.LittleEndian.Uint64(v)
		} else if err != nil && !errors.Is(err, types.ErrorStatusNotFound) {
			return 0, err
		}
		binary.LittleEndian.PutUint64(buf[:], gen+1)
		err = proxywasm.SetSharedData(stateGenKey, buf[:], cas)
		if err == nil {
			return gen + 1, nil
		}
		if !errors.Is(err, types.ErrorStatusCasMismatch) {
			return 0, err
		}
	}
	return 0, errors.New("state generation: too much contention")
}

// createCAS is the CAS a missing key is written with, as the index does
// (index.createCAS): Envoy creates a missing key whatever the CAS, and a
// nonzero one fails if a racer created the key first.
const createCAS = ^uint32(0)

// stateGenBuf receives the pushed state's generation, which refreshState
// reads on every decision: lent to the ABI bridge (GetAppend), the read
// allocates nothing, where GetSharedData has the host call back into the
// VM for memory and allocates 8 bytes per request once a state was pushed.
var stateGenBuf [8]byte

// loadStateGen reads the current generation (0: never pushed).
func loadStateGen(st *sharedStore) uint64 {
	v, _, err := st.GetAppend(stateGenBuf[:0], stateGenKey)
	if err != nil || len(v) != 8 {
		return 0
	}
	return binary.LittleEndian.Uint64(v)
}

// loadState reads and decodes the stored body.
func loadState() (pushedState, error) {
	v, _, err := proxywasm.GetSharedData(stateBodyKey)
	if err != nil {
		return pushedState{}, err
	}
	return decodeSnapshot(v)
}

// stateHeaders handles the request headers of a push: method and
// authorization are checked before any body is read, so a bad push changes
// nothing and costs nothing.
func (s *routerStream) stateHeaders(method string, endOfStream bool) types.Action {
	p := s.plugin
	if method != "POST" {
		p.stats.badMethod.Increment(1)
		return s.reject(&openai.Error{Status: 405, Message: "POST the state snapshot to " + p.cfg.State.Path})
	}
	auth, _ := proxywasm.GetHttpRequestHeader("authorization")
	if !authorized(auth, p.token) {
		p.stats.stateUnauthorized.Increment(1)
		msg := "a valid 'Authorization: Bearer <token>' is required"
		if p.token == "" {
			msg = "the state endpoint is disabled: set state.token or state.tokenEnv in the plugin configuration"
		}
		return s.reject(&openai.Error{Status: 401, Message: msg})
	}
	if endOfStream {
		p.stats.stateRejected.Increment(1)
		return s.reject(openai.BadRequest("", "empty body: POST a kvroute state snapshot (JSON)"))
	}
	if !p.cfg.BodyRouting {
		return s.stateNeedsBody()
	}
	s.stateRequest = true
	return types.ActionPause
}

// stateNeedsBody answers a push in header-only mode. Without
// allow_on_headers_stop_iteration Envoy hands the filter no body while it
// holds the headers, and headers let go reach an engine at once (with the
// bearer token): so the push is answered here, from the headers, and
// refused. The state path is never forwarded, in any mode.
func (s *routerStream) stateNeedsBody() types.Action {
	p := s.plugin
	p.stats.stateRejected.Increment(1)
	return s.reject(&openai.Error{Status: 501, Message: "this gateway runs kvroute in header-only mode (bodyRouting: false), " +
		"where Envoy forwards a request's headers before the filter can read its body: it cannot take state pushes. " +
		"Pull the state instead (state.pull), push to a kvroute.router with bodyRouting: true and " +
		"allow_on_headers_stop_iteration: true (same vm_id), or list the engines in the plugin's endpoints"})
}

func (s *routerStream) stateBody(bodySize int, endOfStream bool) types.Action {
	p := s.plugin
	if bodySize > p.cfg.MaxBodyBytes {
		s.stateRequest = false
		p.stats.stateRejected.Increment(1)
		return s.reject(tooLarge(p.cfg.MaxBodyBytes))
	}
	if !endOfStream {
		return types.ActionPause
	}
	s.stateRequest = false
	body, err := proxywasm.GetHttpRequestBody(0, bodySize)
	if err != nil {
		body = nil
	}
	st, err := decodeSnapshot(body)
	if err == nil && st.TimestampMs > p.now().UnixMilli()+maxPushAheadMs {
		err = fmt.Errorf("timestampMs: %d is more than %d s ahead of this gateway's clock (%d): check the metrics service's clock", st.TimestampMs, maxPushAheadMs/1000, p.now().UnixMilli())
	}
	if err != nil {
		p.stats.stateRejected.Increment(1)
		return s.reject(openai.BadRequest("", "invalid state snapshot: %v", err))
	}
	gen, err := storeState(p.store, body, st.TimestampMs)
	if len(st.Gateways) > 0 {
		p.learnReports(&st) // even from a push refused as older: routes are facts
	}
	if len(st.Removals) > 0 {
		p.learnRemovals(st.Removals) // so are evictions
	}
	var older *olderStateError
	if errors.As(err, &older) {
		p.stats.stateOlder.Increment(1)
		return s.reject(&openai.Error{Status: 409, Message: err.Error()})
	}
	if err != nil {
		proxywasm.LogErrorf("kvroute.router: storing pushed state: %v", err)
		return s.reject(&openai.Error{Status: 503, Message: "could not store the state; retry"})
	}
	p.stats.statePushes.Increment(1)
	p.applyPushed(gen, st) // validated above: no second decode
	reply := []byte(`{"accepted":true,"generation":`)
	reply = strconv.AppendUint(reply, gen, 10)
	reply = append(reply, `,"hosts":`...)
	reply = strconv.AppendInt(reply, int64(len(p.hosts)), 10)
	reply = append(reply, '}')
	if err := proxywasm.SendHttpResponse(200, [][2]string{{"content-type", "application/json"}}, reply, -1); err != nil {
		proxywasm.LogWarnf("kvroute.router: answering the state push: %v", err)
	}
	return types.ActionPause
}
