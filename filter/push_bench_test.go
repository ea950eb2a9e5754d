package filter

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
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
	gen := loadStateGen() + 1
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
		if err := p.rt.Register(h.Address, &sh); err != nil {
			sh.Slot = -1
		}
	}
	for _, h := range st.Hosts {
		if _, ok := p.ix.Lookup(h.Address); !ok {
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
