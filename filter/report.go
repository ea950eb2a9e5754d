package filter

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"strconv"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/snapshot"
)

// Gateway reports (docs/topology.md). Every worker keeps the routes it
// decided since its last flush (scope: worker, in this VM only) and, on
// its tick, appends them as one entry to the gateway's report ring in
// shared data (scope: gateway). One worker at a time, the holder of the
// report lease (shared data, scope: gateway), POSTs everything the ring
// gathered since the previous report, with the gateway's load counters, to
// the metrics service once per interval: one report per gateway per
// interval whatever the worker count. The lease expires when its holder
// stops renewing it (its VM is gone or stuck), and the next worker whose
// tick finds it expired takes over. The service pushes every gateway's
// reports to every gateway, which marks the other gateways' routes in its
// index and prefix memory and counts their load. Scope of the result: the
// fleet, through the metrics service only. A gateway without the service
// keeps routing on its own knowledge: the other gateways' load pictures
// age out with the pushed state (stale state drops them).

// gatewayIDKey holds the gateway's id, made by the first worker that
// starts: every worker of one Envoy reports the same id.
const gatewayIDKey = "kvroute/gateway/id"

// The report ring and lease, in the gateway's shared data:
//   - reportSeqKey: the next entry's sequence number (8 bytes, little
//     endian); a worker claims one with a CAS increment;
//   - reportRingKey + seq mod reportRingSlots: one worker's routes since its
//     previous flush: 8 bytes of seq (which entry this is, so a reader tells
//     a slot not yet written or already overwritten from the one it wants),
//     then the routes' JSON objects, comma-separated;
//   - reportLeaseKey: the holder's worker id, the lease's expiry, the last
//     report's time and the ring position reported up to (4 x 8 bytes).
const (
	reportSeqKey    = "kvroute/report/seq"
	reportLeaseKey  = "kvroute/report/lease"
	reportRingKey   = "kvroute/report/ring/"
	reportRingSlots = 512
	// reportLeaseMs is how long a lease outlives its holder's last
	// renewal beyond two intervals: the POST's timeout, so that a report
	// slow to be answered keeps its lease.
	reportLeaseMs = reportTimeoutMs
	// reportTimeoutMs bounds one report's POST.
	reportTimeoutMs = 2000
	// reportLoadEveryMs is how often a gateway that routed nothing still
	// reports its load picture.
	reportLoadEveryMs = 1000
)

// maxReportRoutes bounds the routes one worker keeps between flushes;
// past it routes are dropped (counted) until the next flush.
const maxReportRoutes = 4096

// reporter is one worker's part in its gateway's reports.
type reporter struct {
	gateway string
	worker  uint64 // this VM's id in the lease (random)
	routes  []byte // JSON route objects since the last flush, comma-separated
	n       int
	dropped uint64
	// inFlight: this worker's report is on its way; it keeps the lease
	// until the answer.
	inFlight bool
	// stuck is a ring entry claimed but not yet written when this worker
	// last reported (its writer between the claim and the write): the next
	// report waits for it once, then skips it.
	stuck    uint64
	hasStuck bool
	store    index.Store
	chainBuf []byte
	entry    []byte
	body     []byte
}

// gatewayID reads the gateway's id from shared data, making it if no
// worker has yet (16 hex digits, random).
func gatewayID(store *sharedStore) (string, error) {
	for range maxCASAttempts {
		v, _, err := store.Get(gatewayIDKey)
		if err == nil && len(v) > 0 {
			return string(v), nil
		}
		if err != nil && !errors.Is(err, index.ErrNotFound) {
			return "", err
		}
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], rand.Uint64())
		id := hex.EncodeToString(b[:])
		// A CAS no key has: if another worker made the id first, read it.
		if err := store.Set(gatewayIDKey, []byte(id), ^uint32(0)); err == nil {
			return id, nil
		}
	}
	return "", errors.New(gatewayIDKey + ": too much contention")
}

// startReports makes this worker a reporter: the gateway's id, and a tick
// four times as fast as the report interval, so that a route waits at most
// a quarter interval in the worker before the ring has it.
func (p *routerPlugin) startReports() {
	rc := p.cfg.State.Report
	id, err := gatewayID(p.store)
	if err != nil {
		proxywasm.LogWarnf("kvroute.router: gateway id: %v (no routing reports from this worker)", err)
		return
	}
	if p.token == "" {
		proxywasm.LogWarnf("kvroute.router: state.report needs the state token (state.token or state.tokenEnv): the metrics service refuses reports without it")
	}
	p.reporter = &reporter{gateway: id, worker: rand.Uint64() | 1, store: p.store}
	tick := max(rc.IntervalMs/4, 5)
	if p.adm != nil && p.cfg.Admission.TickMs < tick {
		tick = p.cfg.Admission.TickMs
	}
	if err := proxywasm.SetTickPeriodMilliSeconds(uint32(tick)); err != nil {
		proxywasm.LogWarnf("kvroute.router: setting the report tick: %v", err)
	}
}

// addRoute keeps one decision for the next flush: addr now holds chain.
// The whole chain goes (from 0), so that a receiving gateway can also
// remember it in its prefix memory, whose keys are spread along the chain.
//
//go:noinline
func (r *reporter) addRoute(addr string, chain []uint64, promptTokens int, charsPerToken float64) {
	const from = 0
	if len(chain) == 0 {
		return
	}
	if r.n >= maxReportRoutes {
		r.dropped++
		return
	}
	r.chainBuf = r.chainBuf[:0]
	for _, h := range chain[from:] {
		r.chainBuf = binary.LittleEndian.AppendUint64(r.chainBuf, h)
	}
	if r.n > 0 {
		r.routes = append(r.routes, ',')
	}
	r.routes = append(r.routes, `{"address":`...)
	r.routes = strconv.AppendQuote(r.routes, addr)
	r.routes = append(r.routes, `,"from":`...)
	r.routes = strconv.AppendInt(r.routes, int64(from), 10)
	r.routes = append(r.routes, `,"chain":"`...)
	r.routes = base64.StdEncoding.AppendEncode(r.routes, r.chainBuf)
	r.routes = append(r.routes, `","promptTokens":`...)
	r.routes = strconv.AppendInt(r.routes, int64(max(promptTokens, 0)), 10)
	if charsPerToken > 0 {
		r.routes = append(r.routes, `,"charsPerToken":`...)
		r.routes = strconv.AppendFloat(r.routes, charsPerToken, 'f', 3, 64)
	}
	r.routes = append(r.routes, '}')
	r.n++
}

// flush appends this worker's routes to the gateway's ring as one entry:
// claim a sequence number (CAS increment), then write its slot. Under
// contention the routes stay for the next tick.
func (r *reporter) flush() {
	if r.n == 0 {
		return
	}
	for range maxCASAttempts {
		v, cas, err := r.store.Get(reportSeqKey)
		var seq uint64
		switch {
		case errors.Is(err, index.ErrNotFound):
			cas = ^uint32(0) // a CAS no key has: two creators, one wins
		case err != nil || len(v) != 8:
			return
		default:
			seq = binary.LittleEndian.Uint64(v)
		}
		var next [8]byte
		binary.LittleEndian.PutUint64(next[:], seq+1)
		if r.store.Set(reportSeqKey, next[:], cas) != nil {
			continue
		}
		r.entry = binary.LittleEndian.AppendUint64(r.entry[:0], seq)
		r.entry = append(r.entry, r.routes...)
		if r.store.Set(ringKey(seq), r.entry, 0) == nil {
			r.routes, r.n = r.routes[:0], 0
		}
		return
	}
}

func ringKey(seq uint64) string {
	return reportRingKey + strconv.FormatUint(seq%reportRingSlots, 10)
}

// reportLease is the lease record.
type reportLease struct {
	holder, expiresMs, lastMs, cursor uint64
}

func (l *reportLease) encode(b []byte) []byte {
	for _, x := range [4]uint64{l.holder, l.expiresMs, l.lastMs, l.cursor} {
		b = binary.LittleEndian.AppendUint64(b, x)
	}
	return b
}

// readLease reads the lease and its CAS (a CAS no key has when there is
// none yet: the first worker to write creates it).
func (r *reporter) readLease() (reportLease, uint32, bool) {
	v, cas, err := r.store.Get(reportLeaseKey)
	if errors.Is(err, index.ErrNotFound) {
		return reportLease{}, ^uint32(0), true
	}
	if err != nil || len(v) != 32 {
		return reportLease{}, cas, err == nil // a malformed lease is overwritten
	}
	u := binary.LittleEndian.Uint64
	return reportLease{u(v), u(v[8:]), u(v[16:]), u(v[24:])}, cas, true
}

// take decides this worker's part in the gateway's report at nowMs: it
// renews or takes the lease and, when a report is due, claims the ring's
// entries [from, to) for it (the lease's cursor moves past them, so no
// other worker reports them again). ok says to send a report.
func (r *reporter) take(nowMs int64, intervalMs int) (from, to uint64, ok bool) {
	now := uint64(max(nowMs, 0))
	l, cas, readable := r.readLease()
	if !readable {
		return 0, 0, false
	}
	if l.holder != r.worker && l.expiresMs > now {
		return 0, 0, false // another worker reports
	}
	next := l
	next.holder = r.worker
	next.expiresMs = now + uint64(2*intervalMs+reportLeaseMs)
	due := !r.inFlight && (now >= l.lastMs+uint64(intervalMs) || now < l.lastMs)
	if due {
		to = r.ringEnd(l.cursor)
		due = to > l.cursor || now >= l.lastMs+reportLoadEveryMs || now < l.lastMs
	}
	if due {
		next.lastMs, next.cursor = now, to
	}
	if r.store.Set(reportLeaseKey, next.encode(nil), cas) != nil {
		return 0, 0, false // another worker got there first
	}
	return l.cursor, to, due
}

// ringEnd is where a report taken now ends: the ring's next sequence
// number, or the first entry from cursor on that is claimed but not yet
// written (the next report waits for it once, then skips it).
func (r *reporter) ringEnd(cursor uint64) uint64 {
	v, _, err := r.store.Get(reportSeqKey)
	if err != nil || len(v) != 8 {
		return cursor
	}
	end := binary.LittleEndian.Uint64(v)
	if end < cursor {
		return cursor
	}
	for s := max(cursor, end-min(end, reportRingSlots)); s < end; s++ {
		e, _, err := r.store.Get(ringKey(s))
		if err == nil && len(e) >= 8 && binary.LittleEndian.Uint64(e) >= s {
			continue // written (or already overwritten by a newer entry)
		}
		if r.hasStuck && r.stuck == s {
			r.hasStuck = false
			continue
		}
		r.stuck, r.hasStuck = s, true
		return s
	}
	return end
}

// appendRing appends the routes of ring entries [from, to) to b, and
// counts as dropped the entries a newer one overwrote before they were
// reported (more than reportRingSlots flushes between two reports).
func (r *reporter) appendRing(b []byte, from, to uint64) []byte {
	first := true
	if to-from > reportRingSlots {
		r.dropped += to - from - reportRingSlots
		from = to - reportRingSlots
	}
	for s := from; s < to; s++ {
		e, _, err := r.store.Get(ringKey(s))
		if err != nil || len(e) < 8 || binary.LittleEndian.Uint64(e) != s {
			if err == nil && len(e) >= 8 && binary.LittleEndian.Uint64(e) > s {
				r.dropped++
			}
			continue
		}
		if len(e) == 8 {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, e[8:]...)
		// Free the slot's routes; the header says it was reported.
		_ = r.store.Set(ringKey(s), e[:8], 0)
	}
	return b
}

// report is this worker's tick: flush its routes into the ring and, if it
// holds the lease and a report is due, POST the gateway's report: every
// route the ring gathered since the previous one and the gateway's load
// counters per host.
func (p *routerPlugin) report(nowMs int64) {
	r := p.reporter
	rc := &p.cfg.State.Report
	r.flush()
	from, to, ok := r.take(nowMs, rc.IntervalMs)
	if !ok {
		return
	}
	b := append(r.body[:0], `{"gateway":`...)
	b = strconv.AppendQuote(b, r.gateway)
	b = append(b, `,"timestampMs":`...)
	b = strconv.AppendInt(b, nowMs, 10)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, to, 10)
	b = append(b, `,"routes":[`...)
	b = r.appendRing(b, from, to)
	b = append(b, `],"load":[`...)
	loads := p.disp.Loads(nil)
	first := true
	for i := range p.hosts {
		h := &p.hosts[i]
		if h.Slot < 0 || h.Slot >= len(loads) {
			continue
		}
		l := loads[h.Slot]
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, `{"address":`...)
		b = strconv.AppendQuote(b, h.Address)
		b = append(b, `,"inFlight":`...)
		b = strconv.AppendUint(b, uint64(l.InFlight), 10)
		b = append(b, `,"prefillTokens":`...)
		b = strconv.AppendUint(b, uint64(l.PrefillTokens), 10)
		b = append(b, `,"decodeTokens":`...)
		b = strconv.AppendUint(b, uint64(l.DecodeTokens), 10)
		b = append(b, '}')
	}
	b = append(b, "]}"...)
	r.body = b
	headers := [][2]string{
		{":method", "POST"}, {":path", rc.Path}, {":authority", rc.Authority},
		{"content-type", "application/json"}, {"authorization", "Bearer " + p.token},
	}
	if _, err := proxywasm.DispatchHttpCall(rc.Cluster, headers, b, nil, reportTimeoutMs, p.reported); err != nil {
		p.stats.reportsFailed.Increment(1)
		return
	}
	r.inFlight = true
}

// reported is the metrics service's answer to a report.
func (p *routerPlugin) reported(_, _, _ int) {
	p.reporter.inFlight = false
	status := ""
	if hs, err := proxywasm.GetHttpCallResponseHeaders(); err == nil {
		for _, h := range hs {
			if h[0] == ":status" {
				status = h[1]
			}
		}
	}
	if status == "204" || status == "200" {
		p.stats.reportsSent.Increment(1)
		return
	}
	p.stats.reportsFailed.Increment(1)
}

// learnReports applies the other gateways' routes in a push: each marks
// its chain as held by its host in the index and the prefix memory. Only
// the worker that received the push does it (the index and the memory are
// the gateway's), and it does it for a push refused as older too: a route
// is a fact, not state, and applying it twice changes nothing.
func (p *routerPlugin) learnReports(st *snapshot.State) {
	own := ""
	if p.reporter != nil {
		own = p.reporter.gateway
	}
	var chain []uint64
	for i := range st.Gateways {
		rep := &st.Gateways[i]
		if rep.Gateway == own {
			continue
		}
		for _, rt := range rep.Routes {
			ref, ok := p.disp.Lookup(rt.Address)
			if !ok {
				continue
			}
			chain = chain[:0]
			for range rt.From {
				chain = append(chain, 0) // before From: not read (segment-aligned)
			}
			chain = append(chain, rt.Hashes...) // decoded when the push was checked
			if err := p.disp.Learn(ref, rt.Address, chain, rt.From); err != nil {
				p.stats.indexErrors.Increment(1)
			}
		}
	}
}

// learnRemovals applies the engines' evictions a push carries: each
// truncates its host's chain in the index (index.Removed), in the worker
// that received the push (the index is the gateway's shared data). A
// removal applied twice clears bits already clear, so the same removal
// from two service replicas, or from a push refused as older, is harmless.
// The prefix memory keeps its entries: it remembers where a prefix went,
// and the index's match, not the memory, predicts what a host holds.
//
//go:noinline
func (p *routerPlugin) learnRemovals(rs []snapshot.Removal) {
	for _, rm := range rs {
		ref, ok := p.disp.Lookup(rm.Address)
		if !ok {
			continue
		}
		// rm.Hashes: decoded when the push was checked.
		if err := p.disp.Removed(ref, rm.Hashes, rm.From); err != nil {
			p.stats.indexErrors.Increment(1)
			continue
		}
		p.stats.removalsApplied.Increment(1)
	}
}

// remoteLoads sets every host's view of the other gateways' load from a
// push (scorer.Host.LoadMirror): the newest picture per gateway; with this
// gateway's own picture among them, own counts stand for every gateway's
// change since the reports.
func (p *routerPlugin) remoteLoads(reps []snapshot.GatewayReport) {
	own := ""
	if p.reporter != nil {
		own = p.reporter.gateway
	}
	newest := map[string]*snapshot.GatewayReport{}
	for i := range reps {
		r := &reps[i]
		if r.Load == nil {
			continue
		}
		if o := newest[r.Gateway]; o == nil || o.TimestampMs < r.TimestampMs {
			newest[r.Gateway] = r
		}
	}
	for i := range p.hosts {
		h := &p.hosts[i]
		h.RemoteInFlight, h.RemotePrefillTokens, h.RemoteDecodeTokens, h.LoadMirror = 0, 0, 0, 0
	}
	if len(newest) == 0 || len(newest) == 1 && newest[own] != nil {
		return
	}
	g := int64(len(newest))
	mine := newest[own]
	if mine == nil {
		g = 1 // no own picture to scale against: plain sums
	}
	for gw, r := range newest {
		k := int64(1)
		if gw == own {
			k = -(g - 1)
		}
		for _, l := range r.Load {
			j, ok := p.pos[l.Address]
			if !ok {
				continue
			}
			h := &p.hosts[j]
			h.RemoteInFlight += int(k * int64(l.InFlight))
			h.RemotePrefillTokens += k * l.PrefillTokens
			h.RemoteDecodeTokens += k * l.DecodeTokens
			h.LoadMirror = int(g)
		}
	}
}

// dropRemote forgets the other gateways' load when the pushed state is
// stale: without the metrics service a gateway routes on its own counts.
// Out of prepare's line (noinline): state is rarely stale.
//
//go:noinline
func (p *routerPlugin) dropRemote() {
	for i := range p.hosts {
		p.hosts[i].LoadMirror = 0
	}
}
