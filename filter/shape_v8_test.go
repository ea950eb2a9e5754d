package filter

import (
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/v8host"
	"github.com/kvroute/kvroute/openai/openaitest"
)

// BenchmarkBodyShapesInV8 is BenchmarkBodyShapesInWasm on V8, the engine
// Envoy runs by default (internal/testenv/v8host, the module compiled
// eagerly as in Envoy's steady state): the time inside the request-body
// callbacks for 1 MiB bodies of each shape against plain text of the same
// size, sent alternately in the same run ("x-text"). V8's optimising
// compiler and wazero's price Go's Wasm output differently, so a shape's
// ratio is measured on both.
//
//	go test ./filter -run '^$' -bench BodyShapesInV8 -benchtime 5x
func BenchmarkBodyShapesInV8(b *testing.B) {
	needV8(b)
	const size = 1 << 20
	addrs := jsonUpstreams(b, 2, benchCompletion)
	h, err := v8host.Start(v8host.Config{Module: testenv.ModulePath(b), RootID: RootRouter,
		Configuration: "{" + endpointsJSON(addrs) + "}", Upstreams: addrs, CompileEagerly: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(h.Close)
	client := &http.Client{Timeout: 60 * time.Second}
	bodyTime := func() time.Duration {
		s, err := h.Stats()
		if err != nil {
			b.Fatal(err)
		}
		return s.PerCallback["request_body"]
	}
	timed := func(b *testing.B, path, body string) time.Duration {
		t0 := bodyTime()
		if err := postOK(client, h.Filtered+path, body); err != nil {
			b.Fatalf("%s: %v", path, err)
		}
		return bodyTime() - t0
	}
	text := openaitest.Shapes[0]
	seq := 0
	for _, s := range openaitest.Shapes[1:] {
		b.Run(s.Name, func(b *testing.B) {
			for range 3 { // warm-up, unmeasured
				seq++
				timed(b, text.Path, text.Body(size, seq))
				timed(b, s.Path, s.Body(size, seq))
			}
			var tText, tShape time.Duration
			b.ResetTimer()
			for range b.N {
				seq++
				tText += timed(b, text.Path, text.Body(size, seq))
				tShape += timed(b, s.Path, s.Body(size, seq))
			}
			ms := func(d time.Duration) float64 { return float64(d) / float64(b.N) / float64(time.Millisecond) }
			b.ReportMetric(ms(tText), "text-ms")
			b.ReportMetric(ms(tShape), "ms")
			b.ReportMetric(float64(tShape)/float64(tText), "x-text")
		})
	}
}
