package filter

import (
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
	"github.com/kvroute/kvroute/openai/openaitest"
)

// BenchmarkBodyShapesInWasm measures, in the Wasm host running the built
// module, the CPU time spent in the request-body callbacks for 1 MiB bodies
// of each shape against a plain-text body of the same size sent
// alternately in the same run: each iteration sends one of each. It
// reports both per request and their ratio, "x-text" (the CPU time of the
// callbacks' thread, which unlike wall time does not grow when other
// processes take the cores; wall-x-text is the ratio of wall times).
// Bodies differ per request (a varying first value) so that the index does
// not see one prompt again and again.
//
//	go test ./filter -run '^$' -bench BodyShapesInWasm -benchtime 5x
func BenchmarkBodyShapesInWasm(b *testing.B) {
	const size = 1 << 20
	addrs := jsonUpstreams(b, 2, benchCompletion)
	h, url := wasmhosttest.Start(b, wasmhost.Config{
		Module: testenv.Module(b), VMID: "kvroute", Workers: 1, BufferLimitBytes: 4 * size,
		Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines",
		Filters: []wasmhost.Filter{{RootID: RootRouter, AllowOnHeadersStopIteration: true, Configuration: "{" + endpointsJSON(addrs) + "}"}},
	})
	client := &http.Client{Timeout: 60 * time.Second}
	bodyTime := func() (wall, cpu time.Duration) {
		for _, c := range h.CallStats() {
			if c.Name == "proxy_on_request_body" {
				wall, cpu = wall+c.Total, cpu+c.CPU
			}
		}
		return wall, cpu
	}
	// timed sends body to path and returns the wall and CPU time its body
	// callbacks took.
	timed := func(b *testing.B, path, body string) (time.Duration, time.Duration) {
		w0, c0 := bodyTime()
		if err := postOK(client, url+path, body); err != nil {
			b.Fatalf("%s: %v", path, err)
		}
		w1, c1 := bodyTime()
		return w1 - w0, c1 - c0
	}
	text := openaitest.Shapes[0]
	seq := 0
	for _, s := range openaitest.Shapes[1:] {
		b.Run(s.Name, func(b *testing.B) {
			for range 2 { // warm-up, unmeasured
				seq++
				timed(b, text.Path, text.Body(size, seq))
				timed(b, s.Path, s.Body(size, seq))
			}
			var wText, wShape, cText, cShape time.Duration
			b.ResetTimer()
			for range b.N {
				seq++
				w, c := timed(b, text.Path, text.Body(size, seq))
				wText, cText = wText+w, cText+c
				w, c = timed(b, s.Path, s.Body(size, seq))
				wShape, cShape = wShape+w, cShape+c
			}
			ms := func(d time.Duration) float64 { return float64(d) / float64(b.N) / float64(time.Millisecond) }
			b.ReportMetric(ms(cText), "text-cpu-ms")
			b.ReportMetric(ms(cShape), "cpu-ms")
			b.ReportMetric(float64(cShape)/float64(cText), "x-text")
			b.ReportMetric(float64(wShape)/float64(wText), "wall-x-text")
		})
	}
}
