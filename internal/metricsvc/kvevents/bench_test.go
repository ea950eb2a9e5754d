package kvevents

import (
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// BenchmarkDecode compares Decode with the baseline of decoding the same
// batch generically (msgpack's DecodeInterface into maps and slices), in
// the same run, for both layouts. A batch of 64 stored blocks with their
// token ids is what one vLLM scheduler step of a 1K-token prefill emits.
// Run with: go test -run '^$' -bench Decode -benchmem ./internal/metricsvc/kvevents
func BenchmarkDecode(b *testing.B) {
	hashes := make([]any, 64)
	for i := range hashes {
		hashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	for _, layout := range []struct {
		name    string
		payload []byte
	}{
		{"array", encArrayBatch(b, 1, storedEv{hashes: hashes, medium: "GPU"}, removedEv{hashes: hashes[:8]})},
		{"map", encMapBatch(b, 1, storedEv{hashes: hashes, medium: "GPU"}, removedEv{hashes: hashes[:8]})},
	} {
		b.Run(layout.name+"/Decode", func(b *testing.B) {
			b.SetBytes(int64(len(layout.payload)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Decode(layout.payload); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(layout.name+"/baseline_generic", func(b *testing.B) {
			b.SetBytes(int64(len(layout.payload)))
			b.ReportAllocs()
			for b.Loop() {
				var v any
				if err := msgpack.Unmarshal(layout.payload, &v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeVsGeneric alternates Decode and the generic baseline on
// the same payload inside one loop, so both see the same machine load (the
// shared 2-core machine makes separate runs differ by several times), and
// reports the ratio of their times: below 1 means Decode is faster.
func BenchmarkDecodeVsGeneric(b *testing.B) {
	hashes := make([]any, 64)
	for i := range hashes {
		hashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	for _, layout := range []struct {
		name    string
		payload []byte
	}{
		{"array", encArrayBatch(b, 1, storedEv{hashes: hashes, medium: "GPU"}, removedEv{hashes: hashes[:8]})},
		{"map", encMapBatch(b, 1, storedEv{hashes: hashes, medium: "GPU"}, removedEv{hashes: hashes[:8]})},
	} {
		b.Run(layout.name, func(b *testing.B) {
			var ours, base time.Duration
			for b.Loop() {
				t0 := time.Now()
				if _, err := Decode(layout.payload); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				var v any
				if err := msgpack.Unmarshal(layout.payload, &v); err != nil {
					b.Fatal(err)
				}
				ours += t1.Sub(t0)
				base += time.Since(t1)
			}
			b.ReportMetric(float64(ours.Nanoseconds())/float64(b.N), "decode-ns/op")
			b.ReportMetric(float64(base.Nanoseconds())/float64(b.N), "generic-ns/op")
			b.ReportMetric(float64(ours)/float64(base), "ratio")
		})
	}
}

// BenchmarkTrackerApply measures applying a 64-block store and its removal.
func BenchmarkTrackerApply(b *testing.B) {
	var st, rm Event
	st.Kind, rm.Kind = BlockStored, BlockRemoved
	for i := range 64 {
		st.Hashes = append(st.Hashes, IntHash(uint64(i)))
	}
	rm.Hashes = st.Hashes
	var tr Tracker
	seq := uint64(0)
	b.ReportAllocs()
	for b.Loop() {
		tr.Apply(seq, Batch{Events: []Event{st}}, zeroTime)
		tr.Apply(seq+1, Batch{Events: []Event{rm}}, zeroTime)
		seq += 2
	}
}

var zeroTime time.Time
