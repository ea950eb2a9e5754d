package server

import (
	"context"
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/internal/metricsvc/kvevents"
)

// With KVEvents a server publishes its prefix cache's changes as vLLM
// does: a subscriber that dials its endpoint receives [topic, sequence,
// EventBatch] messages the service's decoder reads, sequences counting up
// from 0, and a 1,000-token prompt stored as 62 full 16-token blocks.
func TestServerPublishesKVEvents(t *testing.T) {
	f := startFleet(t, Options{KVEvents: true})
	s := f.Servers[0]
	if s.KVEventsEndpoint == "" {
		t.Fatal("no KV events endpoint")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial(s.KVEventsEndpoint); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	// A PUB drops what it sends before the subscription is through
	// (ZeroMQ's slow joiner): send requests until a batch arrives.
	got := make(chan zmq4.Msg, 64)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				close(got)
				return
			}
			got <- m
		}
	}()
	lastSeq := int64(-1)
	// recv reads the next message and checks its frames and sequence.
	recv := func() (seq int64, b kvevents.Batch) {
		t.Helper()
		select {
		case m, ok := <-got:
			if !ok {
				t.Fatal("the subscription ended")
			}
			if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
				t.Fatalf("message of %d frames, want [topic, 8-byte sequence, batch]", len(m.Frames))
			}
			seq = int64(binary.BigEndian.Uint64(m.Frames[1]))
			if lastSeq >= 0 && seq != lastSeq+1 {
				t.Fatalf("sequence %d after %d", seq, lastSeq)
			}
			lastSeq = seq
			b, err := kvevents.Decode(m.Frames[2])
			if err != nil {
				t.Fatalf("batch %d does not decode: %v", seq, err)
			}
			return seq, b
		case <-ctx.Done():
			t.Fatalf("no batch in 10 s (the last had sequence %d)", lastSeq)
		}
		return 0, kvevents.Batch{}
	}
	for i := 0; ; i++ {
		if ctx.Err() != nil {
			t.Fatal("no batch in 10 s")
		}
		resp := post(t, s.Addr, "/v1/completions", map[string]any{"prompt": longPrompt(i+1, 1000), "max_tokens": 1})
		io.Copy(io.Discard, resp.Body)
		if len(got) > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond) // the next try
	}
	// The subscription is through. A request's batches all go out before
	// its answer, and the publisher counts them: the measured prompt's are
	// those numbered from before its request to after its answer, read
	// however late they come.
	pub := s.engine.pub
	from := int64(pub.seq.Load())
	resp := post(t, s.Addr, "/v1/completions", map[string]any{"prompt": longPrompt(0, 1000), "max_tokens": 1})
	io.Copy(io.Discard, resp.Body)
	to := int64(pub.seq.Load())
	if to <= from {
		t.Fatalf("a new 1,000-token prompt published no batch (sequence %d)", from)
	}
	stored := 0
	for seq := int64(-1); seq < to-1; {
		var b kvevents.Batch
		seq, b = recv()
		for _, ev := range b.Events {
			if ev.Kind != kvevents.BlockStored {
				continue
			}
			if ev.BlockSize != 16 {
				t.Errorf("BlockStored with block size %d, want 16", ev.BlockSize)
			}
			if seq >= from {
				stored += len(ev.Hashes)
			}
		}
	}
	if stored != 1000/16 {
		t.Errorf("a 1,000-token prompt stored %d blocks, want %d", stored, 1000/16)
	}
}
