package openai

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/openai/openaitest"
)

// BenchmarkBodyShapesNative is the parser alone, natively, over 1 MiB
// bodies of each shape.
func BenchmarkBodyShapesNative(b *testing.B) {
	for _, s := range openaitest.Shapes {
		body := []byte(s.Body(1<<20, 0))
		b.Run(s.Name, func(b *testing.B) {
			p := newParser(b, `{}`)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := p.Parse(body, EndpointOf(s.Path)); (err != nil) != s.Refused() {
					b.Fatalf("refused %v, want %v", err != nil, s.Refused())
				}
			}
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
	for _, s := range openaitest.Shapes {
		body := []byte(s.Body(256<<10, 1))
		parse := func() {
			if _, err := p.Parse(body, EndpointOf(s.Path)); (err != nil) != s.Refused() {
				t.Fatalf("%s: refused %v, want %v", s.Name, err != nil, s.Refused())
			}
		}
		parse() // buffers grow to the body's needs once
		if n := testing.AllocsPerRun(3, parse); n != 0 {
			t.Errorf("%s: %.0f allocations per 256 KiB body, want 0", s.Name, n)
		}
	}
}

// BenchmarkShapeValidate is the validating pass alone (JSON, UTF-8 in
// strings, span table) over a 1 MiB body of each shape, reported against
// a full plain-text parse in the same iterations (x-text), as
// BenchmarkShapeFloors does: the share of a shape's cost that is the
// validator's. Run in Wasm (see BenchmarkShapeFloors for the command).
func BenchmarkShapeValidate(b *testing.B) {
	const size = 1 << 20
	text := []byte(openaitest.Shapes[0].Body(size, 0))
	p := newParser(b, `{}`)
	for _, s := range openaitest.Shapes {
		body := []byte(s.Body(size, 0))
		b.Run(s.Name, func(b *testing.B) {
			now := cpuNow
			if now() == 0 {
				start := time.Now()
				now = func() time.Duration { return time.Since(start) }
			}
			spans := jsonSpans{checkUTF8: true}
			ps := newParser(b, `{}`)
			var tText, tShape, tParse time.Duration
			for range b.N {
				start := now()
				if _, err := p.Parse(text, Completions); err != nil {
					b.Fatal(err.Message)
				}
				mid := now()
				if !scanJSON(body, &spans) {
					b.Fatal("rejected")
				}
				end := now()
				if _, err := ps.Parse(body, EndpointOf(s.Path)); (err != nil) != s.Refused() {
					b.Fatalf("refused %v, want %v", err != nil, s.Refused())
				}
				tText, tShape, tParse = tText+mid-start, tShape+end-mid, tParse+now()-end
			}
			b.ReportMetric(float64(tShape)/float64(tText), "x-text")
			b.ReportMetric(float64(tShape)/float64(b.N)/1e6, "ms")
			b.ReportMetric(float64(tParse)/float64(tText), "parse-x-text")
		})
	}
}

// BenchmarkValidateTokenIDs is the validating pass over 1 MiB prompts of
// token ids of 1, 5 and 6 digits (the shapes' flat ids are all "7"; a
// real tokenizer's ids run to 6 digits), in ms per body. Run in Wasm as
// BenchmarkShapeFloors.
func BenchmarkValidateTokenIDs(b *testing.B) {
	for _, id := range []string{"7", "12345", "151643"} {
		body := []byte(openaitest.Fill(1<<20, `{"model":"m","prompt":[1,`, id, ",", "]}"))
		b.Run(id, func(b *testing.B) {
			now := cpuNow
			if now() == 0 {
				start := time.Now()
				now = func() time.Duration { return time.Since(start) }
			}
			spans := jsonSpans{checkUTF8: true}
			var t time.Duration
			for range b.N {
				start := now()
				if !scanJSON(body, &spans) {
					b.Fatal("rejected")
				}
				t += now() - start
			}
			b.ReportMetric(float64(t)/float64(b.N)/1e6, "ms")
		})
	}
}
