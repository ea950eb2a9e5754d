package filter

import (
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/v8host"
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
	sendShapes(b, 2, func(b *testing.B, path, body string, status int) (time.Duration, time.Duration) {
		w0, c0 := bodyTime()
		if err := postStatus(client, url+path, body, status); err != nil {
			b.Fatalf("%s: %v", path, err)
		}
		w1, c1 := bodyTime()
		return w1 - w0, c1 - c0
	})
}

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
	sendShapes(b, 3, func(b *testing.B, path, body string, status int) (time.Duration, time.Duration) {
		t0 := bodyTime()
		if err := postStatus(client, h.Filtered+path, body, status); err != nil {
			b.Fatalf("%s: %v", path, err)
		}
		return bodyTime() - t0, 0
	})
}

// sendShapes runs a sub-benchmark per shape of openaitest.Shapes: warm
// unmeasured pairs, then b.N pairs, of a plain-text body and a body of the
// shape, each timed by send (the wall and CPU time of its body callbacks;
// CPU 0 when the host does not tell it). It reports the time per request
// of both and the shape's over the plain text's, "x-text": of CPU time when
// the host tells it (wall-x-text then the ratio of wall times), else of
// wall time.
func sendShapes(b *testing.B, warm int, send func(b *testing.B, path, body string, status int) (wall, cpu time.Duration)) {
	const size = 1 << 20
	text := openaitest.Shapes[0]
	seq := 0
	for _, s := range openaitest.Shapes[1:] {
		b.Run(s.Name, func(b *testing.B) {
			status := 200
			if s.Refused() {
				status = 400
			}
			for range warm {
				seq++
				send(b, text.Path, text.Body(size, seq), 200)
				send(b, s.Path, s.Body(size, seq), status)
			}
			var wText, wShape, cText, cShape time.Duration
			b.ResetTimer()
			for range b.N {
				seq++
				w, c := send(b, text.Path, text.Body(size, seq), 200)
				wText, cText = wText+w, cText+c
				w, c = send(b, s.Path, s.Body(size, seq), status)
				wShape, cShape = wShape+w, cShape+c
			}
			ms := func(d time.Duration) float64 { return float64(d) / float64(b.N) / float64(time.Millisecond) }
			if cText == 0 {
				b.ReportMetric(ms(wText), "text-ms")
				b.ReportMetric(ms(wShape), "ms")
				b.ReportMetric(float64(wShape)/float64(wText), "x-text")
				return
			}
			b.ReportMetric(ms(cText), "text-cpu-ms")
			b.ReportMetric(ms(cShape), "cpu-ms")
			b.ReportMetric(float64(cShape)/float64(cText), "x-text")
			b.ReportMetric(float64(wShape)/float64(wText), "wall-x-text")
		})
	}
}
