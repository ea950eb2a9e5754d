package openai

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/openai/openaitest"
	"github.com/tidwall/gjson"
)

// floorSink keeps the floors' loops from being optimised away.
var floorSink int

// BenchmarkShapeFloors measures what bounds a body shape's cost against
// plain text, in the units of BenchmarkBodyShapesInWasm's x-text: each
// iteration parses a 1 MiB plain-text body and then runs one floor over a
// 1 MiB body of a shape, and the benchmark reports the floor's time over
// the parse's ("x-text"). The floors are the least any parser can do:
// a loop that looks at each byte once and counts commas ("byte-loop", over
// flat token ids), reading the token ids out of their digits without any
// validation ("tokens-read"), and the hasher alone for the token ids
// ("tokens-hash") and for the tiny messages ("messages-hash"), the read
// budget's structure scan over the tiny messages ("structure-messages",
// what the part of a body past the budget costs per byte) and its first pass
// over the plain text ("first-pass-text", what the budget adds to it). Beside
// them, what the libraries made for the job cost to validate alone, in
// the same units: gjson's and encoding/json's Valid over the plain text
// itself and over the tiny messages. Run in Wasm, where the ratios matter:
//
//	go build -o /tmp/wasmexec ./index/internal/wasmexec
//	GOOS=wasip1 GOARCH=wasm go test -tags kvroute_hoststore -exec /tmp/wasmexec -run '^$' -bench ShapeFloors -benchtime 20x ./openai/
//
// (-tags kvroute_hoststore: CPU time from wasmexec rather than wall time.)
func BenchmarkShapeFloors(b *testing.B) {
	const size = 1 << 20
	text := []byte(openaitest.Shapes[0].Body(size, 0))
	var tokens, messages []byte
	for _, s := range openaitest.Shapes {
		switch s.Name {
		case "tokens":
			tokens = []byte(s.Body(size, 0))
		case "tiny-messages":
			messages = []byte(s.Body(size, 0))
		}
	}
	var valid func(bool)
	ids := make([]uint32, 0, len(tokens)/2)
	readIDs := func() {
		ids = ids[:0]
		for k := len(`{"model":"m","prompt":[`); k < len(tokens); k++ {
			v := uint32(0)
			for ; tokens[k]-'0' <= 9; k++ {
				v = v*10 + uint32(tokens[k]-'0')
			}
			ids = append(ids, v)
		}
	}
	readIDs()
	h := index.NewHasher(index.HashConfig{})
	var trim trimmer
	nMessages := len(messages) / len(`{"role":"user","content":"hi"},`)
	floors := []struct {
		name string
		run  func()
	}{
		{"byte-loop", func() {
			n := 0
			for _, c := range tokens {
				if c == ',' {
					n++
				}
			}
			floorSink = n
		}},
		{"tokens-read", readIDs},
		{"tokens-hash", func() {
			h.Reset("m", "", "")
			h.Tokens(ids)
		}},
		{"messages-hash", func() {
			h.Reset("m", "", "")
			for range nMessages {
				h.Message("user", "hi")
			}
		}},
		{"structure-messages", func() {
			if e := structureEnd(messages, 0, 0, maxNesting); e != len(messages) {
				b.Fatal("structureEnd missed the end of the tiny messages")
			}
		}},
		{"first-pass-text", func() {
			if _, err := trim.trim(text); err != nil {
				b.Fatal(err.Message)
			}
		}},
		{"gjson-valid-text", func() { valid(gjson.ValidBytes(text)) }},
		{"gjson-valid-messages", func() { valid(gjson.ValidBytes(messages)) }},
		{"json-valid-text", func() { valid(json.Valid(text)) }},
		{"json-valid-messages", func() { valid(json.Valid(messages)) }},
	}
	p := newParser(b, `{}`)
	valid = func(ok bool) {
		if !ok {
			b.Fatal("a library refused a shape's body")
		}
	}
	for _, f := range floors {
		b.Run(f.name, func(b *testing.B) {
			// CPU time when the host tells it (on a shared machine wall
			// time measures the neighbours too), else wall time.
			now := cpuNow
			if now() == 0 {
				start := time.Now()
				now = func() time.Duration { return time.Since(start) }
			}
			var tText, tFloor time.Duration
			for range b.N {
				start := now()
				if _, err := p.Parse(text, Completions); err != nil {
					b.Fatal(err.Message)
				}
				mid := now()
				f.run()
				tText, tFloor = tText+mid-start, tFloor+now()-mid
			}
			b.ReportMetric(float64(tFloor)/float64(tText), "x-text")
			b.ReportMetric(float64(tText)/float64(b.N)/1e6, "text-ms")
		})
	}
}
