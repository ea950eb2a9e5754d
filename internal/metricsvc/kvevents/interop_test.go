package kvevents

import (
	"bytes"
	"context"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/internal/testenv"
)

// The fixtures below are EventBatches byte for byte as vLLM's publisher
// writes them: msgspec's msgpack encoder over the Structs of
// vllm/distributed/kv_events.py. BlockStored's fields in declaration order
// are block_hashes, parent_block_hash, token_ids, block_size, lora_id,
// medium, lora_name, then extra_keys, group_idx, kv_cache_spec_kind and
// kv_cache_spec_sliding_window, which default to None and are omitted
// (omit_defaults=True); BlockRemoved's are block_hashes, medium, group_idx
// (omitted); AllBlocksCleared has none. Tagged Structs put the tag first:
// a "type" key in the map layout (vLLM today), the first element in the
// array layout (array_like=True, earlier vLLM and llm-d-inference-sim).
// The publisher sets data_parallel_rank to its rank (0), so it is sent.
//
// The batch: ts 1700000000.5; BlockStored of hashes [1, 0xcafebabe12345678]
// with parent 7, block size 2, four token ids; BlockRemoved of [1];
// AllBlocksCleared.

// msgpack pieces, assembled by hand.
const (
	fxTS      = "cb41d954fc40200000"                      // float64 1700000000.5
	fxHashes  = "9201cfcafebabe12345678"                  // [1, uint64 0xcafebabe12345678]
	fxRemoved = "9101"                                    // [1]
	fxGPU     = "a3" + "475055"                           // "GPU"
	fxTokens  = "94010203cd012c"                          // [1, 2, 3, 300]
	fxZeros   = "9400000000"                              // [0, 0, 0, 0]
	fxStored  = "ab" + "426c6f636b53746f726564"           // "BlockStored"
	fxRemTag  = "ac" + "426c6f636b52656d6f766564"         // "BlockRemoved"
	fxClrTag  = "b0" + "416c6c426c6f636b73436c6561726564" // "AllBlocksCleared"
)

func str(s string) string { return hex.EncodeToString(append([]byte{0xa0 | byte(len(s))}, s...)) }

// vllmMapBatch is current vLLM's layout, with tokens as the token_ids
// array.
func vllmMapBatch(t testing.TB, tokens string) []byte {
	h := "83" + str("ts") + fxTS +
		str("events") + "93" +
		"88" + str("type") + fxStored +
		str("block_hashes") + fxHashes +
		"b1" + hex.EncodeToString([]byte("parent_block_hash")) + "07" +
		str("token_ids") + tokens +
		str("block_size") + "02" +
		str("lora_id") + "c0" +
		str("medium") + fxGPU +
		str("lora_name") + "c0" +
		"83" + str("type") + fxRemTag + str("block_hashes") + fxRemoved + str("medium") + fxGPU +
		"81" + str("type") + fxClrTag +
		"b2" + hex.EncodeToString([]byte("data_parallel_rank")) + "00"
	b, err := hex.DecodeString(h)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// vllmArrayBatch is the array_like layout.
func vllmArrayBatch(t testing.TB, tokens string) []byte {
	h := "93" + fxTS + "93" +
		"98" + fxStored + fxHashes + "07" + tokens + "02" + "c0" + fxGPU + "c0" +
		"93" + fxRemTag + fxRemoved + fxGPU +
		"91" + fxClrTag +
		"00"
	b, err := hex.DecodeString(h)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func checkFixtureBatch(t *testing.T, name string, b Batch) {
	t.Helper()
	if b.TS != 1700000000.5 || b.DataParallelRank != 0 || len(b.Events) != 3 {
		t.Fatalf("%s: batch = %+v", name, b)
	}
	st := b.Events[0]
	if st.Kind != BlockStored || len(st.Hashes) != 2 || st.Hashes[0] != IntHash(1) || st.Hashes[1] != IntHash(0xcafebabe12345678) ||
		st.Parent != IntHash(7) || st.BlockSize != 2 || st.Tokens != 4 || st.Medium != "GPU" {
		t.Errorf("%s: BlockStored = %+v", name, st)
	}
	if rm := b.Events[1]; rm.Kind != BlockRemoved || len(rm.Hashes) != 1 || rm.Hashes[0] != IntHash(1) || rm.Medium != "GPU" {
		t.Errorf("%s: BlockRemoved = %+v", name, rm)
	}
	if b.Events[2].Kind != AllBlocksCleared {
		t.Errorf("%s: third event = %+v", name, b.Events[2])
	}
}

// TestVLLMWireFixtures decodes both layouts as vLLM writes them, and checks
// that the Encoder the simulator publishes with writes the same bytes.
func TestVLLMWireFixtures(t *testing.T) {
	for _, c := range []struct {
		name   string
		layout Layout
		fx     func(testing.TB, string) []byte
	}{{"map", MapLayout, vllmMapBatch}, {"array", ArrayLayout, vllmArrayBatch}} {
		b, err := Decode(c.fx(t, fxTokens))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		checkFixtureBatch(t, c.name, b)

		e := Encoder{Layout: c.layout}
		e.Stored(StoredEvent{Hashes: []uint64{1, 0xcafebabe12345678}, Parent: 7, HasParent: true, BlockSize: 2, Tokens: 4})
		e.Removed([]uint64{1})
		e.Cleared()
		if got, want := e.Batch(1700000000.5), c.fx(t, fxZeros); !bytes.Equal(got, want) {
			t.Errorf("%s: Encoder wrote\n%x\nvLLM writes\n%x", c.name, got, want)
		}
		if e.Len() != 0 {
			t.Errorf("%s: Batch left %d events behind", c.name, e.Len())
		}
	}
}

// TestInteropConnectMode is vLLM's way: the engine binds its PUB socket,
// the subscriber connects; both layouts arrive over a real ZMQ socket.
func TestInteropConnectMode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub := newPublisher(t, ctx, "127.0.0.1:0")
	defer pub.sock.Close()
	tr := &Tracker{}
	var mu sync.Mutex
	var stored []Event
	sub := &Subscriber{Endpoint: pub.ep, Tracker: tr, OnBatch: func(b Batch, _ SeqResult) {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range b.Events {
			if ev.Kind == BlockStored {
				stored = append(stored, ev)
			}
		}
	}}
	done := make(chan struct{})
	go func() { sub.Run(ctx); close(done) }()
	pub.waitSubscriber()
	send := func(seq uint64, payload []byte) {
		if err := pub.sock.Send(zmq4.NewMsgFrom(Frames("", seq, payload)...)); err != nil {
			t.Fatal(err)
		}
	}
	send(0, vllmMapBatch(t, fxTokens))
	send(1, vllmArrayBatch(t, fxTokens))
	// Stored, removed, cleared, twice: what is left is the clear.
	testenv.WaitFor(t, "both batches", func() bool { return tr.Stats().Batches == 2 })
	if st := tr.Stats(); st.Clears != 2 || st.DecodeErrors != 0 || st.Gaps != 0 || tr.CachedBlocks() != 0 {
		t.Errorf("stats = %+v cached = %d", st, tr.CachedBlocks())
	}
	enc := Encoder{Layout: MapLayout}
	enc.Stored(StoredEvent{Hashes: []uint64{42, 43}, BlockSize: 16, Tokens: 32})
	send(2, bytes.Clone(enc.Batch(3)))
	testenv.WaitFor(t, "stored blocks", func() bool { return tr.CachedBlocks() == 2 })
	mu.Lock()
	if len(stored) != 3 || stored[2].Parent != "" || stored[2].Tokens != 32 || stored[0].Parent != IntHash(7) {
		t.Errorf("OnBatch saw %+v", stored)
	}
	mu.Unlock()
	cancel()
	<-done
}

// TestInteropListenMode is llm-d-inference-sim's way: the subscriber binds,
// every engine connects out and publishes under kv@<pod-ip>@<model>; the
// topic says whose blocks they are. Its replay socket answers [topic, seq,
// payload].
func TestInteropListenMode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	trA, trB := &Tracker{}, &Tracker{}
	replayA := topicReplayServer(t, ctx, "kv@10.0.0.1@llama", map[uint64][]byte{
		1: vllmArrayBatch(t, fxTokens), // a clear, among others
		2: func() []byte {
			e := Encoder{Layout: ArrayLayout}
			e.Stored(StoredEvent{Hashes: []uint64{21}, BlockSize: 16, Tokens: 16})
			return e.Batch(2)
		}(),
	})
	subs := map[string]*Subscriber{
		"10.0.0.1": {Tracker: trA, ReplayEndpoint: replayA},
		"10.0.0.2": {Tracker: trB},
	}
	l := &Listener{Endpoint: "tcp://127.0.0.1:0", Route: func(topic string) *Subscriber {
		ip, _, ok := ParseTopic(topic)
		if !ok {
			return nil
		}
		return subs[ip]
	}}
	errc := make(chan error, 1)
	go func() { errc <- l.Run(ctx) }()
	testenv.WaitFor(t, "listener bound", func() bool { return l.Addr() != "" })

	pubs := map[string]zmq4.Socket{}
	for _, topic := range []string{"kv@10.0.0.1@llama", "kv@10.0.0.2@llama", "kv@10.9.9.9@llama"} {
		p := zmq4.NewPub(ctx)
		defer p.Close()
		if err := p.Dial(l.Addr()); err != nil {
			t.Fatal(err)
		}
		pubs[topic] = p
	}
	// A PUB that connected sends nothing until the SUB's subscription
	// reached it: resend the first batch until it lands.
	first := func(topic string, tr *Tracker, payload []byte) {
		testenv.WaitFor(t, "first batch on "+topic, func() bool {
			if tr != nil && tr.Stats().Batches > 0 {
				return true
			}
			pubs[topic].Send(zmq4.NewMsgFrom(Frames(topic, 0, payload)...))
			time.Sleep(20 * time.Millisecond)
			return tr != nil && tr.Stats().Batches > 0
		})
	}
	e := Encoder{Layout: ArrayLayout}
	e.Stored(StoredEvent{Hashes: []uint64{10, 11}, BlockSize: 16, Tokens: 32})
	first("kv@10.0.0.1@llama", trA, bytes.Clone(e.Batch(1)))
	e.Stored(StoredEvent{Hashes: []uint64{20}, BlockSize: 16, Tokens: 16})
	first("kv@10.0.0.2@llama", trB, bytes.Clone(e.Batch(1)))
	if !trA.Has(IntHash(10)) || trA.Has(IntHash(20)) || !trB.Has(IntHash(20)) || trB.Has(IntHash(10)) {
		t.Fatalf("blocks reached the wrong engine: A has 10 %v, 20 %v; B has 20 %v, 10 %v",
			trA.Has(IntHash(10)), trA.Has(IntHash(20)), trB.Has(IntHash(20)), trB.Has(IntHash(10)))
	}
	// Engine A skips to seq 3: batches 1 and 2 come back from its replay
	// socket in llm-d's framing, then 3 applies.
	e.Stored(StoredEvent{Hashes: []uint64{30}, BlockSize: 16, Tokens: 16})
	if err := pubs["kv@10.0.0.1@llama"].Send(zmq4.NewMsgFrom(Frames("kv@10.0.0.1@llama", 3, bytes.Clone(e.Batch(3)))...)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "seq 3 on A", func() bool { n, _ := trA.Next(); return n == 4 })
	if st := trA.Stats(); st.Replayed != 2 || st.Gaps != 0 || st.Clears != 1 {
		t.Errorf("A after the gap: %+v", st)
	}
	if trA.Has(IntHash(10)) || !trA.Has(IntHash(21)) || !trA.Has(IntHash(30)) {
		t.Errorf("A's replayed batches not applied in order (clear, then 21, then 30)")
	}
	// An engine discovery does not list is counted, not applied anywhere
	// (resent, like the first batches, until its PUB has the subscription).
	testenv.WaitFor(t, "a message from an unknown engine counted", func() bool {
		if l.Unrouted() > 0 {
			return true
		}
		pubs["kv@10.9.9.9@llama"].Send(zmq4.NewMsgFrom(Frames("kv@10.9.9.9@llama", 0, bytes.Clone(e.Batch(4)))...))
		time.Sleep(20 * time.Millisecond)
		return l.Unrouted() > 0
	})
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// topicReplayServer answers replay requests as llm-d-inference-sim does:
// [topic, seq, payload] per batch, then an empty topic, -1 and nothing.
func topicReplayServer(t *testing.T, ctx context.Context, topic string, buffered map[uint64][]byte) string {
	return replayRouter(t, ctx, buffered, func(seq uint64, p []byte) [][]byte {
		if seq == endSeq {
			return Frames("", seq, p)
		}
		return Frames(topic, seq, p)
	})
}

func TestParseTopic(t *testing.T) {
	for _, c := range []struct{ topic, ip, model string }{
		{"kv@10.0.0.7@meta-llama/Llama-3.1-8B", "10.0.0.7", "meta-llama/Llama-3.1-8B"},
		{"kv@fd00::1@m", "fd00::1", "m"},
	} {
		ip, model, ok := ParseTopic(c.topic)
		if !ok || ip != c.ip || model != c.model {
			t.Errorf("ParseTopic(%q) = %q, %q, %v", c.topic, ip, model, ok)
		}
	}
	for _, bad := range []string{"", "kv", "kv@", "kv@@m", "kv@10.0.0.7", "vllm@10.0.0.7@m"} {
		if _, _, ok := ParseTopic(bad); ok {
			t.Errorf("ParseTopic(%q) accepted", bad)
		}
	}
}
