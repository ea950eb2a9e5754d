package dispatch

import (
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scorer"
)

// BenchmarkDecide measures one whole dispatcher decision as the filter makes it
// (index query, profile, record, load accounting, release) for an
// 8k-token prompt whose first half is cached on one host, against the same
// with round robin (index work identical, decision trivial).
func BenchmarkDecide(b *testing.B) {
	text := make([]byte, 32*1024) // 8k tokens at 4 characters per token
	for i := range text {
		text[i] = byte('a' + i*7%26)
	}
	for _, strategy := range []string{"round_robin", "kv_cache_aware"} {
		for _, n := range []int{8, 64} {
			b.Run(fmt.Sprintf("%s/hosts=%d", strategy, n), func(b *testing.B) {
				ix, err := index.New(&index.MemStore{}, index.Config{Now: func() int64 { return 1 << 30 }})
				if err != nil {
					b.Fatal(err)
				}
				h, err := scorer.NewHandler(strategy)
				if err != nil {
					b.Fatal(err)
				}
				r := New(Config{Handler: h, Index: ix, Seed: 1})
				hosts := make([]scorer.Host, n)
				for i := range hosts {
					if err := r.Register(fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1), &hosts[i]); err != nil {
						b.Fatal(err)
					}
				}
				hs := index.NewHasher(ix.Config().Hash)
				hs.Reset("m", "", "")
				hs.Text(string(text[:len(text)/2]))
				warm := &Input{Model: "m", PromptTokens: hs.PromptTokens(), Chain: append([]uint64(nil), hs.Blocks()...), Tokens: hs}
				t, _ := r.Decide(warm, hosts)
				r.Release(&t)
				hs.Reset("m", "", "")
				hs.Text(string(text))
				in := &Input{Model: "m", PromptTokens: hs.PromptTokens(), MaxTokens: 200, Chain: hs.Blocks(), Tokens: hs}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					t, _ := r.Decide(in, hosts)
					r.FirstToken(&t)
					r.Release(&t)
				}
			})
		}
	}
}
