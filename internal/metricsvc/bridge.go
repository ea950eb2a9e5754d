package metricsvc

import (
	"encoding/base64"
	"encoding/binary"
	"sync"
	"time"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/metricsvc/cachestate"
	"github.com/kvroute/kvroute/internal/metricsvc/kvevents"
	"github.com/kvroute/kvroute/snapshot"
)

// Precise cache state in production (docs/cache-state.md): every engine
// whose KV events the service follows has a cachestate.Bridge, fed with
// that engine's event batches and with the routes the gateways report to
// it (POST /v1/reports). The removals it bridges (BlockRemoved on a
// mapped engine block) go to every gateway with the next push
// (snapshot.State.Removals), which truncates that host's chain in each
// gateway's index.
//
// Scope: one engine in one service instance (the fleet's view of that
// engine). Two service replicas each bridge the routes they received; a
// replica that missed a route maps nothing for it (its removals come from
// the replica that got the route), and a removal pushed by both is
// applied twice, which changes nothing.
//
// Batches wait BridgeLag before they are bridged: a gateway reports its
// routes on its tick, so the engine's BlockStored for a request usually
// reaches the service before the route that explains it.

const (
	// DefaultBridgeLag is Config.BridgeLag's default: well above the
	// gateways' default report interval (50 ms) plus a POST.
	DefaultBridgeLag = 500 * time.Millisecond
	// maxQueuedBatches bounds one engine's batches waiting for the lag;
	// past it the oldest are bridged at once.
	maxQueuedBatches = 4096
	// maxPendingRemovals bounds the removals kept between two pushes;
	// past it the oldest are dropped (those chains stay approximate).
	maxPendingRemovals = 20_000
)

// Trust (snapshot.Host.PreciseCacheState): a gateway that trusts a host's
// removals drops its capacity model for that host, so a block whose
// eviction the bridge cannot map (its BlockStored matched no route: the
// route went to another service replica, or came after the bridge lag)
// would be believed until a cached_tokens correction. The bridge is
// trusted while, over the last trustWindow to 2 x trustWindow, its event
// stream is connected, no events were lost (gaps left after replay,
// undecodable batches), at least trustMinStores BlockStored events came
// and at least trustMatched of them were matched to a route. An engine
// that stores nothing for a while (idle) falls back to the capacity model,
// which ages out nothing while nothing new is recorded.
const (
	trustWindow    = 30 * time.Second
	trustMinStores = 16
	trustMatched   = 0.8
)

// hostBridge is one engine's bridge and the batches waiting to enter it.
type hostBridge struct {
	mu     sync.Mutex
	b      cachestate.Bridge
	queue  []queuedBatch
	deltas []cachestate.Delta
	// queued counts, per engine hash, the events of queued batches that
	// name it; early holds the removals bridged on arrival (batch).
	queued map[kvevents.BlockHash]int32
	early  []cachestate.Delta
	// cptN counts the calibrated routes b.CharsPerToken averages.
	cptN int
	// trust counts matched and unmatched stores and lost events in the
	// current and the previous window (trust[1] current), since winStart;
	// seen is what the bridge and the tracker had counted at the last drain.
	trust    [2]trustCounts
	winStart time.Time
	seen     trustCounts
}

type trustCounts struct{ matched, unmatched, lost uint64 }

type queuedBatch struct {
	at    time.Time
	batch kvevents.Batch
}

func newHostBridge() *hostBridge {
	// The gateways' block layout: the index's defaults (the service has no
	// index configuration of its own; docs/cache-state.md).
	return &hostBridge{b: cachestate.Bridge{Hash: index.HashConfig{}.WithDefaults()}}
}

// batch queues one of the engine's event batches. Its evictions of
// blocks the bridge mapped already, and that no queued batch names, are
// bridged at once: only stores wait for the routes that explain them, and
// an eviction held back for the lag is a block the gateways believe for
// that long after the engine dropped it. The rest of the batch waits.
func (hb *hostBridge) batch(b kvevents.Batch, now time.Time) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if hb.queued == nil {
		hb.queued = map[kvevents.BlockHash]int32{}
	}
	// The batch's own stores count first: a block stored and evicted in
	// one batch waits with it.
	clearAt := len(b.Events)
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Kind == kvevents.AllBlocksCleared {
			clearAt = min(clearAt, i) // what follows a clear waits with it
		}
		if ev.Kind != kvevents.BlockRemoved {
			for _, h := range ev.Hashes {
				hb.queued[h]++
			}
		}
	}
	var early []kvevents.BlockHash
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Kind != kvevents.BlockRemoved {
			continue
		}
		keep := ev.Hashes[:0:0]
		for _, h := range ev.Hashes {
			if i < clearAt && hb.queued[h] == 0 && hb.b.Mapped(h) {
				early = append(early, h)
			} else {
				keep = append(keep, h)
				hb.queued[h]++
			}
		}
		ev.Hashes = keep
	}
	if len(early) > 0 {
		eb := kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: early}}}
		hb.early = hb.b.Apply(eb, now.UnixMilli(), hb.early)
	}
	hb.queue = append(hb.queue, queuedBatch{at: now, batch: b})
}

// route reports a request a gateway sent to the engine: its whole chain,
// its prompt length in tokens at the index's fixed characters per token
// (the prompt's canonical length over it, as the gateway counts it), and
// the gateway's calibrated characters per token for the request's model
// (0: not calibrated yet).
func (hb *hostBridge) route(chain []uint64, promptTokens int, charsPerToken float64, now time.Time) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	chars := promptTokens * hb.b.Hash.CharsPerToken
	hb.b.Route(chain, chars, now.UnixMilli())
	hb.calibrate(charsPerToken)
}

// calibrate averages the gateways' calibrations of this engine's model
// into the bridge's characters per token: the mean of the first 16, then
// an EWMA (1/16), so one worker's early estimate cannot pin it. Scope: the
// engine's bridge in this service instance (one engine serves one model);
// each gateway worker learns its ratio from the engine's own
// usage.prompt_tokens (dispatch.Dispatcher.CharsPerToken). Until a
// calibrated route arrives the bridge converts at the index's fixed
// characters per token.
func (hb *hostBridge) calibrate(cpt float64) {
	if !(cpt >= 1 && cpt <= 16) {
		return
	}
	if hb.cptN < 16 {
		hb.cptN++
	}
	c := hb.b.CharsPerToken
	if c == 0 {
		c = cpt
	}
	hb.b.CharsPerToken = c + (cpt-c)/float64(hb.cptN)
}

// trusted reports whether the gateways may trust this engine's removals
// instead of their capacity model (see trustWindow); connected says
// whether its event stream is up.
func (hb *hostBridge) trusted(connected bool) bool {
	if !connected {
		return false
	}
	hb.mu.Lock()
	defer hb.mu.Unlock()
	m := hb.trust[0].matched + hb.trust[1].matched
	all := m + hb.trust[0].unmatched + hb.trust[1].unmatched
	lost := hb.trust[0].lost + hb.trust[1].lost
	return lost == 0 && all >= trustMinStores && float64(m) >= trustMatched*float64(all)
}

// count moves the trust window on to now with the bridge's counters and
// the engine's lost events (tracker gaps and decode errors) so far; hb.mu
// is held.
func (hb *hostBridge) count(now time.Time, lost uint64) {
	st := hb.b.Stats()
	cur := trustCounts{matched: st.Matched, unmatched: st.Unmatched, lost: lost}
	if hb.winStart.IsZero() {
		hb.winStart = now
	}
	if now.Sub(hb.winStart) >= trustWindow {
		hb.trust[0], hb.trust[1] = hb.trust[1], trustCounts{}
		if now.Sub(hb.winStart) >= 2*trustWindow {
			hb.trust[0] = trustCounts{} // nothing drained for a whole window
		}
		hb.winStart = now
	}
	t := &hb.trust[1]
	t.matched += cur.matched - hb.seen.matched
	t.unmatched += cur.unmatched - hb.seen.unmatched
	if cur.lost >= hb.seen.lost {
		t.lost += cur.lost - hb.seen.lost
	}
	hb.seen = cur
}

// drain bridges the batches older than lag (all of them past
// maxQueuedBatches) and returns the removals they imply for address.
// lost is the engine's lost events so far, for the trust window.
func (hb *hostBridge) drain(address string, now time.Time, lag time.Duration, lost uint64, dst []snapshot.Removal) []snapshot.Removal {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	defer hb.count(now, lost)
	dst = removals(dst, address, hb.early)
	clear(hb.early)
	hb.early = hb.early[:0]
	n := 0
	for n < len(hb.queue) && (now.Sub(hb.queue[n].at) >= lag || len(hb.queue)-n > maxQueuedBatches) {
		q := &hb.queue[n]
		for i := range q.batch.Events {
			for _, h := range q.batch.Events[i].Hashes {
				if hb.queued[h]--; hb.queued[h] <= 0 {
					delete(hb.queued, h)
				}
			}
		}
		hb.deltas = hb.b.Apply(q.batch, q.at.UnixMilli(), hb.deltas[:0])
		dst = removals(dst, address, hb.deltas)
		n++
	}
	clear(hb.queue[:n])
	hb.queue = append(hb.queue[:0], hb.queue[n:]...)
	return dst
}

// removals appends the removals among ds for address. Stored: the
// gateways learn it from the reported route itself. Cleared: it travels as
// the host's clearedAtMs.
func removals(dst []snapshot.Removal, address string, ds []cachestate.Delta) []snapshot.Removal {
	for _, d := range ds {
		if d.Kind == cachestate.Removed && d.From < len(d.Chain) {
			dst = append(dst, snapshot.Removal{Address: address, From: d.From, Chain: encodeChain(d.Chain)})
		}
	}
	return dst
}

func (hb *hostBridge) stats() cachestate.Stats {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return hb.b.Stats()
}

// encodeChain is a chain as the snapshot carries it: 8-byte little-endian
// hashes, base64 (std).
func encodeChain(chain []uint64) string {
	raw := make([]byte, 0, 8*len(chain))
	for _, h := range chain {
		raw = binary.LittleEndian.AppendUint64(raw, h)
	}
	return base64.StdEncoding.EncodeToString(raw)
}

// decodeChain reads a chain a report carries (validated by checkReport).
func decodeChain(s string) []uint64 {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil
	}
	out := make([]uint64, 0, len(raw)/8)
	for j := 0; j+8 <= len(raw); j += 8 {
		out = append(out, binary.LittleEndian.Uint64(raw[j:]))
	}
	return out
}

// bridgeRoutes feeds a report's routes to the bridges of their engines.
// A route that starts past block 0 cannot be placed (the bridge correlates
// whole chains) and is skipped; gateways send whole chains.
func (s *Service) bridgeRoutes(rep *snapshot.GatewayReport, now time.Time) {
	for _, rt := range rep.Routes {
		if rt.From != 0 {
			continue
		}
		addr, rank := snapshot.SplitLocation(rt.Address)
		s.mu.Lock()
		var re *rankEvents
		if h := s.hosts[addr]; h != nil && max(rank, 0) < len(h.events) {
			re = h.events[max(rank, 0)]
		}
		s.mu.Unlock()
		if re == nil {
			continue
		}
		if chain := decodeChain(rt.Chain); len(chain) > 0 {
			re.bridge.route(chain, rt.PromptTokens, rt.CharsPerToken, now)
		}
	}
}

// drainBridges bridges every engine's batches that waited the lag and
// books the removals for the next push.
func (s *Service) drainBridges(now time.Time) {
	type hb struct {
		loc  string
		b    *hostBridge
		lost uint64
	}
	var bs []hb
	s.mu.Lock()
	for addr, h := range s.hosts {
		// A rank's removals name its location, as the gateways' index does.
		n := len(h.sample.Ranks)
		for r, re := range h.events {
			if re != nil && (r == 0 || r < n) {
				bs = append(bs, hb{snapshot.Location(addr, r, n), re.bridge, re.lost()})
			}
		}
	}
	s.mu.Unlock()
	var rs []snapshot.Removal
	for _, x := range bs {
		rs = x.b.drain(x.loc, now, s.cfg.BridgeLag, x.lost, rs)
	}
	s.reports.addRemovals(rs)
}
