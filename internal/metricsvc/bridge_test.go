package metricsvc

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/metricsvc/cachestate"
	"github.com/kvroute/kvroute/internal/metricsvc/discovery"
	"github.com/kvroute/kvroute/internal/metricsvc/kvevents"
	"github.com/kvroute/kvroute/internal/metricsvc/push"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/snapshot"
)

// removals are every removal the gateway was pushed so far.
func (g *gateway) removals() []snapshot.Removal {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []snapshot.Removal
	for _, st := range g.accepted {
		out = append(out, st.Removals...)
	}
	return out
}

// The production path of precise cache state: an engine publishes
// vLLM-encoded KV events on a real ZMQ socket, a gateway reports the
// route it sent there, and the engine's eviction reaches the gateways as
// a removal of that route's chain at the depth the evicted engine block
// stands for. The BlockStored goes out before the route's report, as it
// does in production (a gateway reports on its tick).
func TestEngineEvictionIsPushedAsRemoval(t *testing.T) {
	for _, layout := range []kvevents.Layout{kvevents.MapLayout, kvevents.ArrayLayout} {
		t.Run(fmt.Sprint("connect/layout", layout), func(t *testing.T) { testEvictionPushed(t, layout, false, 0) })
	}
	t.Run("listen", func(t *testing.T) { testEvictionPushed(t, kvevents.ArrayLayout, true, 0) })
}

// An engine with two data-parallel ranks publishes each rank's events on
// its own publisher (connect mode: the endpoint's port plus the rank;
// listen mode: the one socket, each batch naming its rank). A route the
// gateways report to rank 1 (host:port|1) meets rank 1's events, and the
// eviction is pushed as a removal of that location, not of the endpoint
// or of rank 0.
func TestRankEvictionIsPushedAsRankRemoval(t *testing.T) {
	t.Run("connect", func(t *testing.T) { testEvictionPushed(t, kvevents.MapLayout, false, 1) })
	t.Run("listen", func(t *testing.T) { testEvictionPushed(t, kvevents.MapLayout, true, 1) })
}

// vllmRanksText is a vLLM page of an engine with n data-parallel ranks.
func vllmRanksText(n int) string {
	var b strings.Builder
	for _, f := range []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"} {
		fmt.Fprintf(&b, "# TYPE %s gauge\n", f)
		for r := range n {
			fmt.Fprintf(&b, "%s{engine=\"%d\",model_name=\"m\"} 0\n", f, r)
		}
	}
	return b.String()
}

func testEvictionPushed(t *testing.T, layout kvevents.Layout, listen bool, rank int) {
	eng := newFakeEngine(t, vllmText(0, 0))
	loc := eng.addr()
	if rank > 0 {
		eng = newFakeEngine(t, vllmRanksText(rank+1))
		loc = snapshot.Location(eng.addr(), rank, rank+1)
	}
	gw := newGateway(t, "tok")
	// The bridge's clock stands still until the test moves it: batches stay
	// queued until their route is in, however slow the machine, and then
	// drain together.
	clock := testenv.NewClock(time.Now())
	cfg := Config{
		Source:         discovery.Fixed{{Address: eng.addr(), Model: "m"}},
		ScrapeInterval: 50 * time.Millisecond,
		ScrapeTimeout:  time.Second,
		Gateways:       []string{gw.url()},
		Token:          push.StaticToken("tok"),
		PushInterval:   10 * time.Second,
		BridgeLag:      300 * time.Millisecond,
		bridgeClock:    clock.Now,
	}
	var pub *zmqPublisher
	if listen {
		cfg.KVEventsListen = "tcp://127.0.0.1:0"
	} else {
		pub = newZMQPublisher(t)
		ep := pub.ep
		if rank > 0 {
			// pub is rank's publisher: rank 0's port is rank below it.
			host, port, _ := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
			p, _ := strconv.Atoi(port)
			ep = "tcp://" + net.JoinHostPort(host, strconv.Itoa(p-rank))
		}
		cfg.Source = discovery.Fixed{{Address: eng.addr(), Model: "m", KVEvents: ep}}
	}
	svc, _, admin := startService(t, cfg)
	deadline := time.Now().Add(10 * time.Second)
	if listen {
		// The engine connects out (llm-d's way) and publishes under
		// kv@<ip>@<model>; clears (which the bridge reads as nothing to
		// map) until the subscription is through.
		sock := dialListener(t, svc)
		ip, _, _ := net.SplitHostPort(eng.addr())
		pub = &zmqPublisher{sock: sock, topic: "kv@" + ip + "@m"}
		enc := kvevents.Encoder{Layout: layout, Rank: rank}
		enc.Cleared()
		clearing := slices.Clone(enc.Batch(0))
		gw.waitState(t, "the listener's first batch", 10*time.Second, func(st snapshot.State) bool {
			pub.send(t, 0, clearing)
			h, _ := hostAt(st, eng.addr(), rank)
			return h.ClearedAtMs > 0
		})
	} else {
		for len(pub.sock.(zmq4.Topics).Topics()) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the service never subscribed")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// A push listing the engine (its rank) as scraped: the service is up.
	// Not its health, a wall-clock judgement (the last good scrape's age)
	// that a loaded machine can flip and that the bridge does not read.
	gw.waitState(t, "a push of the scraped engine", testenv.WaitTimeout, func(st snapshot.State) bool {
		h, ok := hostAt(st, eng.addr(), rank)
		return ok && h.ScrapedAtMs > 0
	})

	// The request: 8 kvroute blocks (2,048 canonical characters, 512
	// tokens at 4 characters a token); the engine stores it as 32 blocks of
	// 16 tokens.
	chain := []uint64{1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008}
	var engine []uint64
	for i := range 32 {
		engine = append(engine, uint64(5001+i))
	}
	bridge := func() *hostBridge {
		svc.mu.Lock()
		defer svc.mu.Unlock()
		if h := svc.hosts[eng.addr()]; h != nil && rank < len(h.events) && h.events[rank] != nil {
			return h.events[rank].bridge
		}
		return nil
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		if !testenv.Poll(5*time.Second, cond) {
			var st cachestate.Stats
			if b := bridge(); b != nil {
				st = b.stats()
			}
			t.Fatalf("timed out waiting for %s; removals pushed: %+v; bridge %+v", what, gw.removals(), st)
		}
	}
	// queued: a batch with an event of kind naming engine block h waits in
	// the bridge's queue.
	queued := func(kind kvevents.Kind, h uint64) func() bool {
		return func() bool {
			b := bridge()
			if b == nil {
				return false
			}
			b.mu.Lock()
			defer b.mu.Unlock()
			for _, q := range b.queue {
				for _, ev := range q.batch.Events {
					if ev.Kind == kind && slices.Contains(ev.Hashes, kvevents.IntHash(h)) {
						return true
					}
				}
			}
			return false
		}
	}
	enc := kvevents.Encoder{Layout: layout, Rank: rank}
	enc.Stored(kvevents.StoredEvent{Hashes: engine, BlockSize: 16, Tokens: 512})
	pub.send(t, 1, slices.Clone(enc.Batch(1)))
	waitFor("the BlockStored batch in the bridge's queue, before the route", queued(kvevents.BlockStored, 5001))
	report := fmt.Sprintf(`{"gateway":"gw-a","timestampMs":%d,"routes":[{"address":%q,"from":0,"chain":%q,"promptTokens":512}]}`,
		time.Now().UnixMilli(), loc, encodeChain(chain))
	if code := postReport(t, admin, "tok", report); code != 204 {
		t.Fatalf("report: status %d", code)
	}
	// An eviction of engine blocks 13 to 32 (tail first, as vLLM evicts):
	// the engine keeps 12 blocks, 192 tokens, 768 characters: the first 3
	// kvroute blocks.
	tail := slices.Clone(engine[12:])
	slices.Reverse(tail)
	enc.Removed(tail)
	pub.send(t, 2, slices.Clone(enc.Batch(2)))
	// And one of a block no route explains: nothing to push.
	enc.Removed([]uint64{9999})
	pub.send(t, 3, slices.Clone(enc.Batch(3)))
	waitFor("the eviction batch in the bridge's queue", queued(kvevents.BlockRemoved, 5032))
	waitFor("the unexplained eviction in the bridge's queue", queued(kvevents.BlockRemoved, 9999))

	// The lag passes: one drain bridges the three batches, and the one push
	// that follows it carries every removal they imply.
	clock.Advance(cfg.BridgeLag)
	waitFor("the removal", func() bool { return len(gw.removals()) > 0 })
	rs := gw.removals()
	want := index.HashConfig{}.WithDefaults().BlocksIn(12 * 16 * 4)
	if want != 3 {
		t.Fatalf("the default layout puts 768 characters at %d blocks; the test assumes 3", want)
	}
	if len(rs) != 1 || rs[0].Address != loc || rs[0].From != want || !slices.Equal(decodeChain(rs[0].Chain), chain) {
		t.Fatalf("pushed removals %+v; want one of %s's chain %v from block %d", rs, loc, chain, want)
	}
	_, text := get(t, admin+"/metrics")
	for kind, want := range map[string]float64{"routes": 1, "matched": 1, "unmatched": 0, "removed": 20, "unmapped": 1} {
		series := fmt.Sprintf(`kvroute_metrics_cache_state_bridge_total{host=%q,kind=%q}`, loc, kind)
		if v, ok := metricValue(text, series); !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
		}
	}
}

// A batch naming a data-parallel rank the engine's metrics do not show is
// dropped and counted (kind unknown_rank); the engine's ranks are
// unaffected.
func TestKVEventsUnknownRankDropped(t *testing.T) {
	eng := newFakeEngine(t, vllmRanksText(2))
	gw := newGateway(t, "tok")
	svc, _, admin := startService(t, Config{
		Source:         discovery.Fixed{{Address: eng.addr(), Model: "m"}},
		ScrapeInterval: 50 * time.Millisecond,
		ScrapeTimeout:  time.Second,
		Gateways:       []string{gw.url()},
		Token:          push.StaticToken("tok"),
		KVEventsListen: "tcp://127.0.0.1:0",
	})
	// A push of the engine scraped with its two ranks (not its health: a
	// loaded machine can flip it, and rank routing does not read it).
	gw.waitState(t, "the engine's two ranks", testenv.WaitTimeout, func(st snapshot.State) bool {
		h, _ := hostAt(st, eng.addr(), 1)
		return h.ScrapedAtMs > 0 && h.DataParallelSize == 2
	})
	ip, _, _ := net.SplitHostPort(eng.addr())
	pub := &zmqPublisher{sock: dialListener(t, svc), topic: "kv@" + ip + "@m"}
	bad := kvevents.Encoder{Layout: kvevents.MapLayout, Rank: 2}
	bad.Stored(kvevents.StoredEvent{Hashes: []uint64{1, 2, 3}, BlockSize: 16, Tokens: 48})
	badBatch := slices.Clone(bad.Batch(1))
	good := kvevents.Encoder{Layout: kvevents.MapLayout, Rank: 1}
	good.Stored(kvevents.StoredEvent{Hashes: []uint64{7}, BlockSize: 16, Tokens: 16})
	goodBatch := slices.Clone(good.Batch(1))
	st := gw.waitState(t, "rank 1's block", 10*time.Second, func(st snapshot.State) bool {
		pub.send(t, 0, badBatch)
		pub.send(t, 0, goodBatch)
		h, _ := hostAt(st, eng.addr(), 1)
		return h.CachedBlocks == 1
	})
	for _, h := range st.Hosts {
		if h.Address == eng.addr() && h.Rank != 1 && h.CachedBlocks != 0 {
			t.Errorf("rank %d holds %d blocks, want 0 (rank 2's batch must go nowhere)", h.Rank, h.CachedBlocks)
		}
		if h.Rank > 1 {
			t.Errorf("pushed a rank the engine does not have: %+v", h)
		}
	}
	_, text := get(t, admin+"/metrics")
	if v, _ := metricValue(text, fmt.Sprintf(`kvroute_metrics_kv_events_total{host=%q,kind="unknown_rank"}`, eng.addr())); v == 0 {
		t.Error("rank 2's batches were not counted as unknown_rank")
	}
	if v, _ := metricValue(text, fmt.Sprintf(`kvroute_metrics_kv_events_total{host=%q,kind="batches"}`, eng.addr()+"|1")); v == 0 {
		t.Error("rank 1's batches are not counted under host:port|1")
	}
}
