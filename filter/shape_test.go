package filter

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
)

// bodyShape is one way of filling a request body of a given size: the
// plain-text prompt every other shape is compared with, and the shapes
// whose many small values made the parser's cost per byte hundreds of
// times that of plain text.
type bodyShape struct {
	name string
	path string
	// body returns a body of about n bytes; i varies it (a question
	// number) so that consecutive requests are not identical.
	body func(n, i int) string
}

// fill returns head, then unit repeated (with sep between) until the body
// is about n bytes, then tail.
func fill(n int, head, unit, sep, tail string) string {
	var b strings.Builder
	b.Grow(n + len(tail) + len(unit))
	b.WriteString(head)
	for k := 0; b.Len()+len(unit)+len(tail) < n; k++ {
		if k > 0 {
			b.WriteString(sep)
		}
		b.WriteString(unit)
	}
	b.WriteString(tail)
	return b.String()
}

// bodyShapes are the shapes BenchmarkBodyShapesInWasm and
// TestBodyShapesAllocate measure; the first, plain text, is the baseline.
var bodyShapes = []bodyShape{
	{"text", "/v1/completions", func(n, i int) string {
		return fill(n, `{"model":"m","prompt":"`+strconv.Itoa(i)+` `, "You are a careful assistant.", " ", `"}`)
	}},
	{"token-batches", "/v1/completions", func(n, i int) string {
		return fill(n, `{"model":"m","prompt":[[`+strconv.Itoa(i+1)+`,1],`, "[7,8]", ",", `]}`)
	}},
	{"tokens", "/v1/completions", func(n, i int) string {
		return fill(n, `{"model":"m","prompt":[`+strconv.Itoa(i+1)+`,`, "7", ",", `]}`)
	}},
	{"string-batches", "/v1/completions", func(n, i int) string {
		return fill(n, `{"model":"m","prompt":["`+strconv.Itoa(i)+`",`, `"ab"`, ",", `]}`)
	}},
	{"tiny-messages", "/v1/chat/completions", func(n, i int) string {
		return fill(n, `{"model":"m","messages":[{"role":"user","content":"`+strconv.Itoa(i)+`"},`, `{"role":"user","content":"hi"}`, ",", `]}`)
	}},
	{"tiny-parts", "/v1/chat/completions", func(n, i int) string {
		return fill(n, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"`+strconv.Itoa(i)+`"},`,
			`{"type":"text","text":"hi"}`, ",", `]}]}`)
	}},
	{"image-parts", "/v1/chat/completions", func(n, i int) string {
		return fill(n, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"`+strconv.Itoa(i)+`"},`,
			`{"type":"image_url","image_url":{"url":"u"}}`, ",", `]}]}`)
	}},
	{"tool-calls", "/v1/chat/completions", func(n, i int) string {
		return fill(n, `{"model":"m","messages":[{"role":"user","content":"`+strconv.Itoa(i)+`"},{"role":"assistant","tool_calls":[`,
			`{"id":"c","function":{"name":"f","arguments":"{}"}}`, ",", `]}]}`)
	}},
	{"unused-keys", "/v1/completions", func(n, i int) string {
		return fill(n, `{"model":"m","prompt":"`+strconv.Itoa(i)+`",`, `"k":0`, ",", `}`)
	}},
	{"unused-keys-in-message", "/v1/chat/completions", func(n, i int) string {
		return fill(n, `{"model":"m","messages":[{"role":"user","content":"`+strconv.Itoa(i)+`",`, `"k":0`, ",", `}]}`)
	}},
	{"unused-containers", "/v1/completions", func(n, i int) string {
		return fill(n, `{"model":"m","prompt":"`+strconv.Itoa(i)+`","x":[`, `{"a":[]}`, ",", `]}`)
	}},
	{"escapes", "/v1/completions", func(n, i int) string {
		return fill(n, `{"model":"m","prompt":"`+strconv.Itoa(i), `\n`, "", `"}`)
	}},
	{"escaped-batches", "/v1/completions", func(n, i int) string {
		return fill(n, `{"model":"m","prompt":["`+strconv.Itoa(i)+`",`, `"\n"`, ",", `]}`)
	}},
	// searched-worst is the costliest unit TestBodyShapeSearch found per
	// byte: image parts whose URL holds an escape and non-ASCII text.
	{"searched-worst", "/v1/chat/completions", func(n, i int) string {
		return fill(n, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"`+strconv.Itoa(i)+`"},`,
			`{"type":"image_url","image_url":{"url":"\n日"}}`, ",", `]}]}`)
	}},
}

// BenchmarkBodyShapesNative is the parser alone, natively, over 1 MiB
// bodies of each shape.
func BenchmarkBodyShapesNative(b *testing.B) {
	for _, s := range bodyShapes {
		body := []byte(s.body(1<<20, 0))
		b.Run(s.name, func(b *testing.B) {
			p := newParser(b, `{}`)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := p.parse(body, kindOf(s.path)); err != nil {
					b.Fatal(err.Message)
				}
			}
		})
	}
}

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
		Module: wasmModule(b), VMID: "kvroute", Workers: 1, BufferLimitBytes: 4 * size,
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
	text := bodyShapes[0]
	seq := 0
	for _, s := range bodyShapes[1:] {
		b.Run(s.name, func(b *testing.B) {
			for range 2 { // warm-up, unmeasured
				seq++
				timed(b, text.path, text.body(size, seq))
				timed(b, s.path, s.body(size, seq))
			}
			var wText, wShape, cText, cShape time.Duration
			b.ResetTimer()
			for range b.N {
				seq++
				w, c := timed(b, text.path, text.body(size, seq))
				wText, cText = wText+w, cText+c
				w, c = timed(b, s.path, s.body(size, seq))
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

// TestBodyShapesAllocate checks that no body shape makes the parser
// allocate where plain text does not: a reused parser reads each 256 KiB
// body without an allocation. A 1 MiB body of token-id batches made 349k
// allocations (an error path's name built per batch, an encoding buffer
// per batch), and in Wasm the garbage collector's work made it cost 400
// times a plain-text body of the same size. Allocation counts are exact,
// where times move with the machine.
func TestBodyShapesAllocate(t *testing.T) {
	p := newParser(t, `{}`)
	for _, s := range bodyShapes {
		body := []byte(s.body(256<<10, 1))
		parse := func() {
			if _, err := p.parse(body, kindOf(s.path)); err != nil {
				t.Fatalf("%s: %s", s.name, err.Message)
			}
		}
		parse() // buffers grow to the body's needs once
		if n := testing.AllocsPerRun(3, parse); n != 0 {
			t.Errorf("%s: %.0f allocations per 256 KiB body, want 0", s.name, n)
		}
	}
}
