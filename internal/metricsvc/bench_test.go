package metricsvc

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/metricsvc/discovery"
	"github.com/kvroute/kvroute/internal/metricsvc/scrape"
)

// BenchmarkAssemble measures building, comparing and encoding the snapshot
// of a 128-engine fleet (what each assembler wake-up costs) against the
// baseline of only encoding that snapshot with encoding/json, alternating
// in one loop. At most ten wake-ups per scrape interval are processed.
func BenchmarkAssemble(b *testing.B) {
	s, err := New(Config{Source: discovery.Fixed{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	s.started, s.discOK = now.Add(-time.Hour), true
	for i := range 128 {
		addr := fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1)
		s.hosts[addr] = &host{
			ep: discovery.Endpoint{Address: addr, Role: "decode", Model: "llama-3-8b"}, attempted: true, lastOK: now,
			sample: scrape.Sample{Waiting: i % 7, Running: i % 13, KVUsage: 0.5, BlockSize: 16, NumGPUBlocks: 27000, Adapters: []string{"a", "b"}},
			events: []*rankEvents{newRankEvents(time.Now)},
		}
	}
	var ours, base time.Duration
	for i := 0; b.Loop(); i++ {
		// change one host each time so every round publishes
		for _, h := range s.hosts {
			h.sample.Waiting = i
			break
		}
		t0 := time.Now()
		s.assembleAndPublish(now)
		t1 := time.Now()
		if _, err := json.Marshal(s.current); err != nil {
			b.Fatal(err)
		}
		ours += t1.Sub(t0)
		base += time.Since(t1)
	}
	b.ReportMetric(float64(ours.Nanoseconds())/float64(b.N), "assemble-ns/op")
	b.ReportMetric(float64(base.Nanoseconds())/float64(b.N), "marshal-ns/op")
	b.ReportMetric(float64(ours)/float64(base), "ratio")
}
