package metricsvc

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/metricsvc/kvevents"
	"github.com/kvroute/kvroute/snapshot"
)

// storeBatch is one BlockStored of n 16-token engine blocks from the
// start of a prompt, hashes first, first+1, ...
func storeBatch(first uint64, n int) kvevents.Batch {
	ev := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 16, Tokens: 16 * n}
	for i := range n {
		ev.Hashes = append(ev.Hashes, kvevents.IntHash(first+uint64(i)))
	}
	return kvevents.Batch{Events: []kvevents.Event{ev}}
}

// The gateways trust a host's removals instead of their capacity model
// only while its bridge earns it: the stream connected, enough stores
// matched to reported routes, nothing lost, within the window.
func TestBridgeTrust(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	hb := newHostBridge()
	// n requests reported to the engine, each stored as 8 engine blocks
	// (512 characters of a 1,024-character prompt at 4 a token); those
	// from unexplained on have no route (reports lost, or sent to
	// another service replica).
	feed := func(at time.Time, from, n, unexplained int) {
		for i := from; i < from+n; i++ {
			if i-from < unexplained {
				hb.batch(storeBatch(uint64(1_000_000+i*100), 8), at)
				continue
			}
			hb.route([]uint64{uint64(i*10 + 1), uint64(i*10 + 2), uint64(i*10 + 3), uint64(i*10 + 4)}, 256, 0, at)
			hb.batch(storeBatch(uint64(1_000_000+i*100), 8), at)
		}
	}
	drain := func(at time.Time, lost uint64) { hb.drain("10.0.0.1:8000", at, 0, lost, nil) }

	feed(t0, 0, trustMinStores-1, 0)
	drain(t0, 0)
	if hb.trusted(true) {
		t.Fatalf("trusted after %d matched stores, want at least %d first", trustMinStores-1, trustMinStores)
	}
	feed(t0, 100, 1, 0)
	drain(t0, 0)
	if !hb.trusted(true) {
		t.Fatalf("not trusted after %d matched stores (stats %+v)", trustMinStores, hb.stats())
	}
	if hb.trusted(false) {
		t.Fatal("trusted with the event stream disconnected")
	}
	if drain(t0, 1); hb.trusted(true) {
		t.Fatal("trusted after a gap the replay did not fill")
	}

	// Two windows on: the gap has aged out; a quarter of the stores
	// unexplained is too many.
	t1 := t0.Add(2 * trustWindow)
	drain(t1, 1)
	feed(t1, 200, 40, 10)
	drain(t1, 1)
	if hb.trusted(true) {
		t.Fatalf("trusted with 10 of 40 stores unexplained (stats %+v)", hb.stats())
	}
	t2 := t1.Add(2 * trustWindow)
	drain(t2, 1)
	feed(t2, 300, 40, 2)
	drain(t2, 1)
	if !hb.trusted(true) {
		t.Fatalf("not trusted with 2 of 40 stores unexplained, nothing lost in the window (stats %+v)", hb.stats())
	}
	// An engine that stores nothing for two windows falls back.
	if drain(t2.Add(2*trustWindow), 1); hb.trusted(true) {
		t.Fatal("still trusted after two windows without a store")
	}
}

// The bridge converts engine tokens to kvroute characters at the
// gateways' calibrated characters per token for the engine's model: a
// model of 8 characters a token has an eviction that keeps 256 tokens cut
// the chain at 2,048 characters (8 kvroute blocks), not at 1,024 as the
// index's fixed 4 would.
func TestBridgeCalibratedCharsPerToken(t *testing.T) {
	for _, tc := range []struct {
		cpt  float64
		from int
	}{{0, 4}, {8, 8}} {
		hb := newHostBridge()
		now := time.Unix(1_800_000_000, 0)
		chain := make([]uint64, 16) // 4,096 characters: 1,024 tokens at 4 a token, 512 at 8
		for i := range chain {
			chain[i] = uint64(100 + i)
		}
		for range 3 {
			hb.route(chain, 1024, tc.cpt, now) // the first calibrated routes set it
		}
		hb.batch(storeBatch(5001, 32), now) // 512 tokens
		ev := kvevents.Event{Kind: kvevents.BlockRemoved}
		for i := 16; i < 32; i++ {
			ev.Hashes = append(ev.Hashes, kvevents.IntHash(uint64(5001+i)))
		}
		hb.batch(kvevents.Batch{Events: []kvevents.Event{ev}}, now)
		rs := hb.drain("10.0.0.1:8000", now, 0, 0, nil)
		if len(rs) != 1 || rs[0].From != tc.from {
			t.Errorf("characters per token %v: removals %+v, want one from block %d", tc.cpt, rs, tc.from)
		}
	}
}

// A calibration the gateways report out of range, or none, leaves the
// bridge's characters per token alone; several average.
func TestBridgeCalibrationAverages(t *testing.T) {
	hb := newHostBridge()
	now := time.Now()
	for _, c := range []float64{0, -3, 40, 6, 7} {
		hb.route([]uint64{1}, 10, c, now)
	}
	if got := hb.b.CharsPerToken; got != 6.5 {
		t.Errorf("after calibrations 0, -3, 40, 6 and 7: %v characters per token, want 6.5", got)
	}
}

// A pull with the cursor of the previous one gets every route and removal
// pushed since, not only the last push's; without a cursor, the last push
// as it went out; with another instance's cursor, everything logged.
func TestPullLogSince(t *testing.T) {
	l := newPullLog()
	now := time.Now()
	push := func(gw string, removal string, load bool) (snapshot.State, string) {
		st := snapshot.State{Version: 1, TimestampMs: now.UnixMilli()}
		st.Gateways = []snapshot.GatewayReport{{Gateway: gw, Routes: []snapshot.Route{{Address: "10.0.0.1:8000", Chain: "AAAAAAAAAAA="}}}}
		if load {
			st.Gateways = append(st.Gateways, snapshot.GatewayReport{Gateway: gw, Load: []snapshot.HostLoad{{Address: "10.0.0.1:8000", InFlight: 3}}})
		}
		st.Removals = []snapshot.Removal{{Address: "10.0.0.1:8000", Chain: removal}}
		if n := l.add(&st, now); l.cursor() != l.id+"."+strconv.FormatUint(n, 10) {
			t.Fatalf("push number %d, cursor %q", n, l.cursor())
		}
		return st, l.cursor()
	}
	_, c1 := push("a", "AQAAAAAAAAA=", false)
	push("b", "AgAAAAAAAAA=", false)
	last, c3 := push("c", "AwAAAAAAAAA=", true)
	for _, c := range []string{c1, c3} {
		for _, r := range c {
			if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r == '.') || len(c) > 64 {
				t.Fatalf("cursor %q: not what a gateway accepts", c)
			}
		}
	}
	routes := func(st snapshot.State) (gws []string, loads int) {
		for _, g := range st.Gateways {
			if len(g.Routes) > 0 {
				gws = append(gws, g.Gateway)
			}
			if g.Load != nil {
				loads++
			}
		}
		return gws, loads
	}
	got := l.since(last, c1)
	if gws, loads := routes(got); strings.Join(gws, ",") != "b,c" || loads != 1 || len(got.Removals) != 2 || got.Cursor != c3 {
		t.Errorf("since the first push: routes of %v, %d load pictures, %d removals, cursor %q; want b,c, 1, 2, %q", gws, loads, len(got.Removals), got.Cursor, c3)
	}
	if got := l.since(last, c3); len(got.Removals) != 0 || len(got.Gateways) != 1 {
		t.Errorf("since the last push: %d removals, %d gateway entries; want none but the load picture", len(got.Removals), len(got.Gateways))
	}
	if got := l.since(last, ""); len(got.Removals) != 1 || got.Cursor != c3 {
		t.Errorf("without a cursor: %d removals, cursor %q; want the last push's 1 and %q", len(got.Removals), got.Cursor, c3)
	}
	if got := l.since(last, "other.2"); len(got.Removals) != 3 {
		t.Errorf("another instance's cursor: %d removals, want all 3 logged", len(got.Removals))
	}
	// A pushed gateway whose last push was the first gets the same, with
	// no cursor (it does not pull).
	got = l.sinceSeq(last, 1)
	if gws, loads := routes(got); strings.Join(gws, ",") != "b,c" || loads != 1 || len(got.Removals) != 2 || got.Cursor != "" {
		t.Errorf("pushed since the first push: routes of %v, %d load pictures, %d removals, cursor %q; want b,c, 1, 2, none", gws, loads, len(got.Removals), got.Cursor)
	}
}

// An eviction of a block the bridge mapped already goes out with the
// next push, without waiting the bridge lag (only stores wait for their
// routes); an eviction of a block whose store is still waiting waits
// behind it.
func TestBridgeEvictionSkipsTheLag(t *testing.T) {
	const lag = time.Minute
	t0 := time.Unix(1_800_000_000, 0)
	hb := newHostBridge()
	chain := []uint64{11, 12, 13, 14, 15, 16, 17, 18} // 2,048 characters
	hb.route(chain, 512, 0, t0)
	hb.batch(storeBatch(5001, 32), t0) // the route's 512 tokens
	if rs := hb.drain("10.0.0.1:8000", t0.Add(lag), lag, 0, nil); len(rs) != 0 {
		t.Fatalf("a store made removals %+v", rs)
	}
	removed := func(first, n int) kvevents.Batch {
		ev := kvevents.Event{Kind: kvevents.BlockRemoved}
		for i := range n {
			ev.Hashes = append(ev.Hashes, kvevents.IntHash(uint64(first+i)))
		}
		return kvevents.Batch{Events: []kvevents.Event{ev}}
	}
	t1 := t0.Add(2 * lag)
	hb.batch(removed(5001+16, 16), t1) // mapped: keeps 16 blocks, 256 tokens, 4 kvroute blocks
	rs := hb.drain("10.0.0.1:8000", t1, lag, 0, nil)
	if len(rs) != 1 || rs[0].From != 4 {
		t.Fatalf("an eviction of mapped blocks, drained at once: removals %+v, want one from block 4", rs)
	}

	// A second prompt stored and evicted within the lag: the eviction
	// waits behind its store.
	hb.route([]uint64{21, 22, 23, 24, 25, 26, 27, 28}, 512, 0, t1)
	hb.batch(storeBatch(6001, 32), t1)
	hb.batch(removed(6001, 32), t1)
	if rs := hb.drain("10.0.0.1:8000", t1, lag, 0, nil); len(rs) != 0 {
		t.Fatalf("an eviction of blocks whose store waits went out first: %+v", rs)
	}
	if rs := hb.drain("10.0.0.1:8000", t1.Add(lag), lag, 0, nil); len(rs) != 1 || rs[0].From != 0 {
		t.Fatalf("after the lag: removals %+v, want one of the second chain from block 0", rs)
	}
}
