package openai

import (
	"testing"

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
				if _, err := p.Parse(body, EndpointOf(s.Path)); err != nil {
					b.Fatal(err.Message)
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
			if _, err := p.Parse(body, EndpointOf(s.Path)); err != nil {
				t.Fatalf("%s: %s", s.Name, err.Message)
			}
		}
		parse() // buffers grow to the body's needs once
		if n := testing.AllocsPerRun(3, parse); n != 0 {
			t.Errorf("%s: %.0f allocations per 256 KiB body, want 0", s.Name, n)
		}
	}
}
