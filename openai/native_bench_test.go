package openai

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/dispatch"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scorer"
)

// BenchmarkDecideNative is the router filter's request work without Wasm:
// parse and hash the body, then decide among 16 hosts over an in-memory
// shared-data store. Compare with BenchmarkRouterInWasm's overhead.
func BenchmarkDecideNative(b *testing.B) {
	for _, size := range []struct {
		name  string
		bytes int
	}{{"1Ktok", 4 << 10}, {"8Ktok", 32 << 10}, {"32Ktok", 128 << 10}, {"220KB", 220 << 10}} {
		system := strings.Repeat("You are a careful assistant for the kvroute benchmark. ", size.bytes/55)
		body := []byte(chatBody(system, "question"))
		b.Run(size.name+"/validate", func(b *testing.B) {
			// The parser's one pass: JSON, UTF-8 in strings, span table.
			spans := jsonSpans{checkUTF8: true}
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				if !scanJSON(body, &spans) {
					b.Fatal("rejected")
				}
			}
		})
		b.Run(size.name+"/parse+hash", func(b *testing.B) {
			p := newParser(b, `{}`)
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				if _, err := p.Parse(body, Chat); err != nil {
					b.Fatal(err.Message)
				}
			}
		})
		b.Run(size.name+"/parse+hash+decide", func(b *testing.B) {
			p := newParser(b, `{}`)
			ix, _ := index.New(&index.MemStore{}, index.Config{})
			h, _ := scorer.NewHandler("kv_cache_aware")
			rt := dispatch.New(dispatch.Config{Handler: h, Index: ix})
			hosts := make([]scorer.Host, 16)
			for i := range hosts {
				rt.Register(fmt.Sprintf("10.0.0.%d:8000", i), &hosts[i])
			}
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				r, _ := p.Parse(body, Chat)
				in := dispatch.Input{Model: r.Model, PromptTokens: r.PromptTokens, MaxTokens: r.MaxTokens, Chain: p.hasher.Blocks(), Tokens: p.hasher}
				t, _ := rt.Decide(&in, hosts)
				rt.Release(&t)
			}
		})
	}
}
