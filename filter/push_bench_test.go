package filter

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/internal/testenv"
)

// pushBodies returns k snapshots of n hosts stamped ts, ts+1, ...: the
// queue numbers move in each, and with churn a tenth of the addresses are
// new in each.
func pushBodies(n, k int, ts int64, churn bool) [][]byte {
	out := make([][]byte, k)
	for j := range out {
		hs := make([]string, n)
		for i := range hs {
			a := i
			if churn && i < n/10 {
				a = n + j*n + i // new in every snapshot
			}
			hs[i] = fmt.Sprintf(`{"address":"10.%d.%d.%d:8000","healthy":true,"waiting":%d,"running":%d,"kvUsage":0.%d,"blockSize":16,"numGpuBlocks":4096}`,
				a>>16, a>>8&255, a&255, (i+j)%7, (i*j)%5, (i+j)%9)
		}
		out[j] = []byte(fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[%s]}`, ts+int64(j), strings.Join(hs, ",")))
	}
	return out
}

// storePush writes body as the pushed state and bumps the generation, as
// a push received by another worker does, and returns the generation.
func storePush(b *testing.B, body []byte) uint64 {
	if err := proxywasm.SetSharedData(stateBodyKey, body, 0); err != nil {
		_, cas, _ := proxywasm.GetSharedData(stateBodyKey)
		if err = proxywasm.SetSharedData(stateBodyKey, body, cas); err != nil {
			b.Fatal(err)
		}
	}
	gen := loadStateGen(&sharedStore{emulated: true}) + 1
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], gen)
	_, cas, err := proxywasm.GetSharedData(stateGenKey)
	if err != nil && err != types.ErrorStatusNotFound {
		b.Fatal(err)
	}
	if err := proxywasm.SetSharedData(stateGenKey, buf[:], cas); err != nil {
		b.Fatal(err)
	}
	return gen
}

// applyStateReregistering is how a worker applied a push before Sync, the
// baseline: decode, re-register every host with the index (a read of the
// slot table and a CAS loop each), then look every host up again for its
// capacity.
func (p *routerPlugin) applyStateReregistering(gen uint64) {
	st, err := loadState()
	if err != nil {
		panic(err)
	}
	for _, h := range st.Hosts {
		var sh = p.hosts[0]
		if err := p.disp.Register(h.Address, &sh); err != nil {
			sh.Slot = -1
		}
	}
	for _, h := range st.Hosts {
		if _, ok := p.disp.Index().Lookup(h.Address); !ok {
			continue
		}
		_ = h.BlockSize * h.NumGPUBlocks
	}
	p.stateGen, p.stateTs = gen, st.TimestampMs
}

// BenchmarkStatePushApply measures what a worker pays to apply a push
// another worker stored (on its tick, or its first request after the push)
// at 16, 128 and 1,000 hosts: reregister is the baseline (every host
// re-registered, as before Sync), delta a push where only queue numbers
// move (the usual push), churn one where a tenth of the addresses are new.
// Compare delta and churn with reregister at the same size, in one run.
func BenchmarkStatePushApply(b *testing.B) {
	for _, n := range []int{16, 128, 1000} {
		for _, mode := range []string{"reregister", "delta", "churn"} {
			b.Run(fmt.Sprintf("hosts=%d/%s", n, mode), func(b *testing.B) {
				_, p := newHost(b, RootRouter, `{"endpoints":[{"address":"10.255.0.1:8000"}],"state":{"token":"t"}}`, types.OnPluginStartStatusOK)
				bodies := pushBodies(n, 16, 1_800_000_000_000, mode == "churn")
				p.applyState(storePush(b, bodies[0])) // the hosts are known
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					gen := storePush(b, bodies[(i+1)%len(bodies)])
					b.StartTimer()
					if mode == "reregister" {
						p.applyStateReregistering(gen)
					} else {
						p.applyState(gen)
					}
				}
			})
		}
	}
}

// BenchmarkStatePushInWasm measures applying a push inside the built
// module (dist/kvroute.wasm, or KVROUTE_WASM), two workers taking streams
// in turn: each iteration pushes a snapshot of n hosts (worker A validates,
// stores and applies it), then sends a request to worker B, which applies
// the push first unless its tick already did, then one to A, which has
// nothing to apply. Reported per push, in ms: push, first (B's request)
// and request (A's), and first/request, the apply's cost as a multiple of
// a routed request measured in the same run.
func BenchmarkStatePushInWasm(b *testing.B) {
	for _, n := range []int{16, 128, 1000} {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			engines := jsonUpstreams(b, 2, benchCompletion)
			// The engines lead every snapshot; the other hosts are down,
			// so requests go to the engines.
			bodies := make([]string, 8)
			for j := range bodies {
				hs := make([]string, 0, n)
				for i := 0; i < n; i++ {
					if i < len(engines) {
						hs = append(hs, fmt.Sprintf(`{"address":%q,"waiting":%d}`, engines[i], j%3))
						continue
					}
					hs = append(hs, fmt.Sprintf(`{"address":"10.%d.%d.%d:8000","healthy":false,"waiting":%d,"running":%d,"kvUsage":0.%d,"blockSize":16,"numGpuBlocks":4096}`,
						i>>16, i>>8&255, i&255, (i+j)%7, (i*j)%5, (i+j)%9))
				}
				bodies[j] = strings.Join(hs, ",")
			}
			_, url := startRouter(b, engines, 2, `,"fallbacks":0,"state":{"token":"`+stateToken+`"}`)
			auth := map[string]string{"authorization": "Bearer " + stateToken}
			ts := time.Now().Add(-time.Hour).UnixMilli()
			timed := func(u, body string, hdr map[string]string) float64 {
				start := time.Now()
				if code, resp, _ := testenv.Call(b, "POST", u, body, hdr); code != 200 {
					b.Fatalf("%s: %d %s", u, code, resp)
				}
				return float64(time.Since(start).Microseconds()) / 1000
			}
			push := func(j int) float64 {
				ts++
				return timed(url+"/.kvroute/v1/state", fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[%s]}`, ts, bodies[j%len(bodies)]), auth)
			}
			// Warm both workers (the first push registers every host).
			for j := 0; j < 4; j++ {
				push(j)
				timed(url+"/v1/completions", completion, nil)
			}
			var pushMs, firstMs, reqMs float64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				pushMs += push(i)                                        // worker A
				firstMs += timed(url+"/v1/completions", completion, nil) // worker B
				reqMs += timed(url+"/v1/completions", completion, nil)   // worker A
			}
			b.ReportMetric(pushMs/float64(b.N), "push-ms")
			b.ReportMetric(firstMs/float64(b.N), "first-ms")
			b.ReportMetric(reqMs/float64(b.N), "request-ms")
			b.ReportMetric(firstMs/reqMs, "first/request")
		})
	}
}
