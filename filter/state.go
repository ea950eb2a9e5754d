package filter

import (
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

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
			if inForce, ok := snapshot.TimestampOf(cur); ok && ts < inForce {
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
func loadState() (snapshot.State, error) {
	v, _, err := proxywasm.GetSharedData(stateBodyKey)
	if err != nil {
		return snapshot.State{}, err
	}
	return snapshot.Decode(v)
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
	st, err := snapshot.Decode(body)
	if err == nil && st.TimestampMs > p.now().UnixMilli()+maxPushAheadMs {
		err = &snapshot.Error{Path: "timestampMs", Msg: fmt.Sprintf("%d is more than %d s ahead of this gateway's clock (%d): check the metrics service's clock", st.TimestampMs, maxPushAheadMs/1000, p.now().UnixMilli())}
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
