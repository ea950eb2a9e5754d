// Scratch tuning harness (not committed): runs strategies on the trace
// through internal/router with the real index.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
	"github.com/kvroute/kvroute/scorer"
)

type adapter struct {
	r       *router.Router
	ix      *index.Index
	hasher  *index.Hasher
	hosts   []scorer.Host
	tickets map[*workload.Request]*router.Ticket
	now     int64
	probe   *index.Index
	lost, lostN, lostBig int64
}

func (a *adapter) Route(wr *workload.Request, prompt string, now time.Duration) int {
	a.now = now.Milliseconds()
	a.hasher.Reset(wr.Model, "", "")
	a.hasher.Text(prompt)
	in := &router.Input{Model: wr.Model, SessionKey: wr.Session, PromptTokens: wr.PromptTokens, MaxTokens: wr.OutputTokens,
		Chain: a.hasher.Blocks(), Tokens: a.hasher}
	var m index.Matches
	a.probe.Query(in.Chain, &m)
	_, best := m.Best()
	bestTok := 0
	if best > 0 {
		bestTok = min(a.hasher.TokensIn(best), wr.PromptTokens)
	}
	t, _ := a.r.Decide(in, a.hosts)
	a.lost += int64(bestTok - t.PredictedCachedTokens)
	if bestTok > t.PredictedCachedTokens {
		a.lostN++
		if wr.PromptTokens > 20000 {
			a.lostBig += int64(bestTok - t.PredictedCachedTokens)
		}
	}
	a.tickets[wr] = &t
	return t.Host
}
func (a *adapter) FirstToken(wr *workload.Request, _ int, now time.Duration) {
	if t := a.tickets[wr]; t != nil {
		a.r.FirstToken(t)
	}
}
func (a *adapter) Done(wr *workload.Request, _ int, cached int, now time.Duration) {
	if t := a.tickets[wr]; t != nil {
		a.r.Feedback(t, cached)
		a.r.Release(t)
		delete(a.tickets, wr)
	}
}
func (a *adapter) ObserveState(st []sim.Stats, now time.Duration) {
	for i := range a.hosts {
		a.hosts[i].Waiting, a.hosts[i].Running, a.hosts[i].KVUsage = st[i].Waiting, st[i].Running, st[i].KVUsage
	}
}

func main() {
	trace := flag.String("trace", "/work/shared/traces/mooncake_synthetic.jsonl", "")
	n := flag.Int("replicas", 8, "")
	strategies := flag.String("strategies", "round_robin,kv_cache_aware", "")
	config := flag.String("config", "", "JSON config with extra profiles")
	rate := flag.Float64("rate-scale", 1, "")
	limit := flag.Int("limit", 0, "")
	flag.Parse()
	w, err := workload.LoadMooncake(*trace, workload.TraceOptions{RateScale: *rate, Limit: *limit})
	if err != nil {
		panic(err)
	}
	prof, _ := sim.LookupProfile("")
	names := strings.Split(*strategies, ",")
	out := make([]string, len(names))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			cfg, err := scorer.ParseConfig([]byte(*config))
			if err != nil {
				panic(err)
			}
			cfg.Strategy = name
			h, _, err := cfg.Build()
			if err != nil {
				panic(err)
			}
			a := &adapter{tickets: map[*workload.Request]*router.Ticket{}}
			hc := index.HashConfig{}
			icfg := index.Config{Now: func() int64 { return a.now }, Hash: hc}
			if h.Decode.Index != nil {
				icfg.Hash.BlockChars = h.Decode.Index.BlockChars
				icfg.Hash.LevelBlocks = -1
			}
			icfg.Shards = 16384
			store := &index.MemStore{}
			ix, err := index.New(store, icfg)
			if err != nil {
				panic(err)
			}
			a.ix = ix
			a.probe, _ = index.New(store, icfg)
			a.hasher = index.NewHasher(icfg.Hash)
			a.r = router.New(router.Config{Handler: h, Index: ix, Seed: 1})
			a.hosts = make([]scorer.Host, *n)
			capTokens := prof.NumGPUBlocks() * prof.BlockSize
			for k := range a.hosts {
				if err := a.r.Register(fmt.Sprintf("10.0.0.%d:8000", k+1), &a.hosts[k]); err != nil {
					panic(err)
				}
				if h.Decode.Index != nil && h.Decode.Index.CapacityBlocksPerHost > 0 {
					ix.SetCapacity(index.HostRef{Slot: a.hosts[k].Slot, Gen: a.hosts[k].Gen}, h.Decode.Index.CapacityBlocksPerHost*h.Decode.Index.BlockChars/4)
				} else {
					ix.SetCapacity(index.HostRef{Slot: a.hosts[k].Slot, Gen: a.hosts[k].Gen}, capTokens)
				}
			}
			res, err := fleet.Run(fleet.Config{Replicas: *n, Profile: prof}, w, a)
			if err != nil {
				panic(err)
			}
			s := res.Summarize()
			st := a.r.Stats()
			out[i] = fmt.Sprintf("%-22s ttft p50 %7.0f p90 %7.0f p99 %7.0f ms  e2e p50 %7.0f  hit %.3f  imb %.2f  rt p50 %v p99 %v  pred %d conf %d over %d  lost %dk in %d (big %dk) wall %v",
				name, ms(s.TTFT.P50), ms(s.TTFT.P90), ms(s.TTFT.P99), ms(s.E2E.P50), s.HitRatio, s.LoadImbalance, s.RouterTime.P50, s.RouterTime.P99,
				st.PredictedCachedTokens/1000, st.ConfirmedCachedTokens/1000, st.OverPredicted, a.lost/1000, a.lostN, a.lostBig/1000, res.Wall.Round(time.Millisecond))
			fmt.Fprintln(os.Stderr, out[i])
		}()
	}
	wg.Wait()
	fmt.Printf("ceiling %.3f\n", fleet.Ceiling(w, prof, *n))
	for _, o := range out {
		fmt.Println(o)
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }
