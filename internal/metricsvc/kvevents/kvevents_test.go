package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/internal/testenv"
)

// The encoders below write the two layouts vLLM has used, the way msgspec
// lays them out: tagged arrays with fields in declaration order, and maps
// whose "type" key carries the tag.

type storedEv struct {
	hashes []any // uint64, int64 or []byte
	medium any   // nil or string
	group  any   // nil or int
}

func encArrayBatch(t testing.TB, ts float64, evs ...any) []byte {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	must(t, e.EncodeArrayLen(3))
	must(t, e.EncodeFloat64(ts))
	must(t, e.EncodeArrayLen(len(evs)))
	for _, ev := range evs {
		switch ev := ev.(type) {
		case storedEv:
			// BlockStored: hashes, parent, token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx
			must(t, e.EncodeArrayLen(10))
			must(t, e.EncodeString("BlockStored"))
			must(t, e.Encode(ev.hashes))
			must(t, e.EncodeNil())
			must(t, e.Encode([]int{101, 102, 103, 104}))
			must(t, e.EncodeInt(16))
			must(t, e.EncodeNil())
			must(t, e.Encode(ev.medium))
			must(t, e.EncodeNil())
			must(t, e.EncodeNil())
			must(t, e.Encode(ev.group))
		case removedEv:
			must(t, e.EncodeArrayLen(3))
			must(t, e.EncodeString("BlockRemoved"))
			must(t, e.Encode(ev.hashes))
			must(t, e.Encode(ev.medium))
		case string: // AllBlocksCleared or an unknown tag
			must(t, e.EncodeArrayLen(1))
			must(t, e.EncodeString(ev))
		}
	}
	must(t, e.EncodeNil()) // data_parallel_rank
	return buf.Bytes()
}

type removedEv struct {
	hashes []any
	medium any
}

func encMapBatch(t testing.TB, ts float64, evs ...any) []byte {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	must(t, e.EncodeMapLen(3))
	must(t, e.EncodeString("ts"))
	must(t, e.EncodeFloat64(ts))
	must(t, e.EncodeString("events"))
	must(t, e.EncodeArrayLen(len(evs)))
	for _, ev := range evs {
		switch ev := ev.(type) {
		case storedEv:
			must(t, e.EncodeMapLen(6))
			must(t, e.EncodeString("type"))
			must(t, e.EncodeString("BlockStored"))
			must(t, e.EncodeString("block_hashes"))
			must(t, e.Encode(ev.hashes))
			must(t, e.EncodeString("token_ids"))
			must(t, e.Encode([]int{1, 2, 3}))
			must(t, e.EncodeString("block_size"))
			must(t, e.EncodeInt(16))
			must(t, e.EncodeString("medium"))
			must(t, e.Encode(ev.medium))
			must(t, e.EncodeString("group_idx"))
			must(t, e.Encode(ev.group))
		case removedEv:
			// tag last: order must not matter
			must(t, e.EncodeMapLen(2))
			must(t, e.EncodeString("block_hashes"))
			must(t, e.Encode(ev.hashes))
			must(t, e.EncodeString("type"))
			must(t, e.EncodeString("BlockRemoved"))
		case string:
			must(t, e.EncodeMapLen(1))
			must(t, e.EncodeString("type"))
			must(t, e.EncodeString(ev))
		}
	}
	must(t, e.EncodeString("data_parallel_rank"))
	must(t, e.EncodeInt(2))
	return buf.Bytes()
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestDecodeArrayLayout(t *testing.T) {
	p := encArrayBatch(t, 12.5,
		storedEv{hashes: []any{uint64(1 << 63), int64(-5), []byte{0xde, 0xad}}, medium: "GPU", group: 1},
		removedEv{hashes: []any{int64(-5)}},
		"AllBlocksCleared",
		"SomeFutureEvent",
	)
	b, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	if b.TS != 12.5 || b.DataParallelRank != -1 || len(b.Events) != 4 {
		t.Fatalf("batch = %+v", b)
	}
	st := b.Events[0]
	want := []BlockHash{IntHash(1 << 63), IntHash(uint64(1<<64 - 5)), BytesHash([]byte{0xde, 0xad})}
	if st.Kind != BlockStored || st.Medium != "GPU" || st.GroupIdx != 1 || len(st.Hashes) != 3 {
		t.Fatalf("stored = %+v", st)
	}
	for i := range want {
		if st.Hashes[i] != want[i] {
			t.Errorf("hash %d = %q, want %q", i, st.Hashes[i], want[i])
		}
	}
	if b.Events[1].Kind != BlockRemoved || b.Events[1].Hashes[0] != IntHash(uint64(1<<64-5)) {
		t.Errorf("removed = %+v", b.Events[1])
	}
	if b.Events[2].Kind != AllBlocksCleared || b.Events[3].Kind != Unknown || b.Events[3].Tag != "SomeFutureEvent" {
		t.Errorf("tail = %+v", b.Events[2:])
	}
}

func TestDecodeMapLayout(t *testing.T) {
	p := encMapBatch(t, 3,
		storedEv{hashes: []any{uint64(7), uint64(8)}, medium: nil, group: nil},
		removedEv{hashes: []any{uint64(7)}},
		"AllBlocksCleared",
	)
	b, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	if b.TS != 3 || b.DataParallelRank != 2 || len(b.Events) != 3 {
		t.Fatalf("batch = %+v", b)
	}
	if e := b.Events[0]; e.Kind != BlockStored || len(e.Hashes) != 2 || e.Hashes[1] != IntHash(8) || e.Medium != "" {
		t.Errorf("stored = %+v", e)
	}
	if e := b.Events[1]; e.Kind != BlockRemoved || len(e.Hashes) != 1 || e.Hashes[0] != IntHash(7) {
		t.Errorf("removed = %+v", e)
	}
	if b.Events[2].Kind != AllBlocksCleared {
		t.Errorf("cleared = %+v", b.Events[2])
	}
}

func TestDecodeRejectsGarbage(t *testing.T) {
	valid := encArrayBatch(t, 1, storedEv{hashes: []any{uint64(1)}})
	cases := map[string][]byte{
		"empty":             {},
		"not a container":   {0x05},
		"string":            []byte("\xa3abc"),
		"huge array":        {0xdd, 0xff, 0xff, 0xff, 0xff, 0x00},
		"truncated":         valid[:len(valid)-3],
		"trailing bytes":    append(append([]byte{}, valid...), 0x01),
		"short batch":       {0x91, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0},
		"map no events":     {0x81, 0xa2, 't', 's', 0x01},
		"event no tag":      {0x92, 0x01, 0x91, 0x90},
		"map event no type": {0x92, 0x01, 0x91, 0x81, 0xa6, 'm', 'e', 'd', 'i', 'u', 'm', 0xc0},
		"hash is a float":   {0x92, 0x01, 0x91, 0x92, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0},
	}
	for name, p := range cases {
		_, err := Decode(p)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(encArrayBatch(f, 1, storedEv{hashes: []any{uint64(1), []byte("x")}, medium: "CPU"}, removedEv{hashes: []any{int64(2)}}, "AllBlocksCleared"))
	f.Add(encMapBatch(f, 2, storedEv{hashes: []any{uint64(1)}}, "AllBlocksCleared"))
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := Decode(p)
		if err != nil {
			return
		}
		var tr Tracker
		tr.Apply(0, b, time.Now())
		if tr.CachedBlocks() < 0 {
			t.Fatalf("negative cached blocks")
		}
	})
}

func TestTrackerCountsAndSequence(t *testing.T) {
	var tr Tracker
	now := time.Unix(100, 0)
	ev := func(k Kind, medium string, hs ...uint64) Event {
		e := Event{Kind: k, Medium: medium}
		for _, h := range hs {
			e.Hashes = append(e.Hashes, IntHash(h))
		}
		return e
	}
	if r := tr.Apply(5, Batch{Events: []Event{ev(BlockStored, "", 1, 2, 3), ev(BlockStored, "CPU", 9)}}, now); !r.First {
		t.Errorf("first = %+v", r)
	}
	if got := tr.CachedBlocks(); got != 3 {
		t.Fatalf("cached = %d, want 3 (CPU blocks do not count)", got)
	}
	// duplicate store and a remove of an unknown block change nothing
	tr.Apply(6, Batch{Events: []Event{ev(BlockStored, "GPU", 1), ev(BlockRemoved, "", 42), ev(BlockRemoved, "", 2)}}, now)
	if got := tr.CachedBlocks(); got != 2 {
		t.Fatalf("cached = %d, want 2", got)
	}
	if !tr.Has(IntHash(1)) || tr.Has(IntHash(2)) {
		t.Errorf("Has wrong")
	}
	r := tr.Apply(9, Batch{}, now)
	if r.Missed != 2 {
		t.Errorf("gap: %+v, want 2 missed", r)
	}
	st := tr.Stats()
	if st.Gaps != 1 || st.MissedBatches != 2 {
		t.Errorf("stats = %+v", st)
	}
	later := now.Add(time.Second)
	tr.Apply(10, Batch{Events: []Event{{Kind: AllBlocksCleared}}}, later)
	if tr.CachedBlocks() != 0 || !tr.ClearedAt().Equal(later) {
		t.Errorf("after clear: cached=%d at=%v", tr.CachedBlocks(), tr.ClearedAt())
	}
	tr.Apply(11, Batch{Events: []Event{ev(BlockStored, "", 5)}}, later)
	restart := later.Add(time.Second)
	if r := tr.Apply(0, Batch{Events: []Event{ev(BlockStored, "", 6)}}, restart); !r.Restarted {
		t.Errorf("restart not detected: %+v", r)
	}
	if tr.CachedBlocks() != 1 || tr.Has(IntHash(5)) || !tr.ClearedAt().Equal(restart) {
		t.Errorf("after restart: cached=%d", tr.CachedBlocks())
	}
}

func TestTrackerBounded(t *testing.T) {
	tr := Tracker{MaxBlocks: 3}
	var e Event
	e.Kind = BlockStored
	for i := range 10 {
		e.Hashes = append(e.Hashes, IntHash(uint64(i)))
	}
	tr.Apply(0, Batch{Events: []Event{e}}, time.Now())
	if tr.CachedBlocks() != 3 || tr.Stats().Overflow != 7 {
		t.Errorf("cached=%d overflow=%d", tr.CachedBlocks(), tr.Stats().Overflow)
	}
}

// publisher is a real ZMQ PUB socket on loopback, framed like vLLM's.
type publisher struct {
	t    *testing.T
	sock zmq4.Socket
	ep   string
}

func newPublisher(t *testing.T, ctx context.Context, addr string) *publisher {
	t.Helper()
	pub := zmq4.NewPub(ctx)
	if err := pub.Listen("tcp://" + addr); err != nil {
		t.Fatal(err)
	}
	p := &publisher{t: t, sock: pub, ep: "tcp://" + pub.Addr().String()}
	return p
}

func (p *publisher) waitSubscriber() {
	p.t.Helper()
	testenv.WaitFor(p.t, "a subscriber to connect", func() bool { return len(p.sock.(zmq4.Topics).Topics()) > 0 })
}

func (p *publisher) send(seq uint64, payload []byte) {
	p.t.Helper()
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	if err := p.sock.Send(zmq4.NewMsgFrom([]byte("kv"), s[:], payload)); err != nil {
		p.t.Fatal(err)
	}
}

// logBuffer collects log lines for assertions.
type logBuffer struct {
	mu  chan struct{}
	buf bytes.Buffer
}

func newLog() (*slog.Logger, func() string) {
	lb := &logBuffer{mu: make(chan struct{}, 1)}
	w := writerFunc(func(p []byte) (int, error) {
		lb.mu <- struct{}{}
		defer func() { <-lb.mu }()
		return lb.buf.Write(p)
	})
	return slog.New(slog.NewTextHandler(w, nil)), func() string {
		lb.mu <- struct{}{}
		defer func() { <-lb.mu }()
		return lb.buf.String()
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestSubscriberRealZMQ(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := newPublisher(t, ctx, "127.0.0.1:0")
	defer pub.sock.Close()

	log, logs := newLog()
	var changes atomic.Int64
	tr := &Tracker{}
	sub := &Subscriber{Endpoint: pub.ep, Topic: "kv", Tracker: tr, Log: log, OnChange: func() { changes.Add(1) }}
	done := make(chan struct{})
	go func() { sub.Run(ctx); close(done) }()
	pub.waitSubscriber()

	// array layout, then map layout, then a gap, then garbage.
	pub.send(0, encArrayBatch(t, 1, storedEv{hashes: []any{uint64(1), uint64(2), uint64(3)}}))
	pub.send(1, encMapBatch(t, 2, storedEv{hashes: []any{uint64(4)}}, removedEv{hashes: []any{uint64(1)}}))
	testenv.WaitFor(t, "two batches", func() bool { return tr.Stats().Batches == 2 })
	if got := tr.CachedBlocks(); got != 3 {
		t.Fatalf("cached blocks = %d, want 3", got)
	}
	pub.send(5, encMapBatch(t, 3, storedEv{hashes: []any{uint64(5)}}))
	testenv.WaitFor(t, "gap", func() bool { return tr.Stats().Gaps == 1 })
	if st := tr.Stats(); st.MissedBatches != 3 {
		t.Errorf("missed = %d, want 3", st.MissedBatches)
	}
	pub.send(6, []byte("\xc1 definitely not msgpack"))
	if err := pub.sock.Send(zmq4.NewMsgFrom([]byte("kv"), []byte("short"))); err != nil {
		t.Fatal(err)
	}
	pub.send(7, encArrayBatch(t, 4, "AllBlocksCleared"))
	testenv.WaitFor(t, "clear", func() bool { return tr.Stats().Clears == 1 })
	if st := tr.Stats(); st.DecodeErrors != 2 || st.Gaps != 1 {
		t.Errorf("stats after garbage = %+v, want 2 decode errors and still 1 gap", st)
	}
	if tr.CachedBlocks() != 0 || tr.ClearedAt().IsZero() {
		t.Errorf("clear not applied")
	}
	if changes.Load() != 4 {
		t.Errorf("OnChange called %d times, want 4 (one per applied batch)", changes.Load())
	}
	out := logs()
	for _, want := range []string{"sequence gap", "missed=3", "KV event batch dropped", "not [topic, 8-byte seq, payload]"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}

	// The engine restarts: the publisher goes away and comes back on the
	// same port with its sequence at zero.
	addr := strings.TrimPrefix(pub.ep, "tcp://")
	pub.sock.Close()
	testenv.WaitFor(t, "disconnect", func() bool { return !sub.Connected() })
	var pub2 *publisher
	testenv.WaitFor(t, "rebind", func() bool {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return false
		}
		l.Close()
		return true
	})
	pub2 = newPublisher(t, ctx, addr)
	defer pub2.sock.Close()
	pub2.waitSubscriber()
	pub2.send(0, encArrayBatch(t, 5, storedEv{hashes: []any{uint64(9)}}))
	testenv.WaitFor(t, "restart", func() bool { return tr.Stats().Restarts == 1 })
	if tr.CachedBlocks() != 1 || !tr.Has(IntHash(9)) {
		t.Errorf("after restart cached=%d", tr.CachedBlocks())
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// replayServer is vLLM's replay socket: a ROUTER that answers an 8-byte
// start sequence with every buffered batch from there on, [seq, payload],
// then -1.
func replayServer(t *testing.T, ctx context.Context, buffered map[uint64][]byte) string {
	return replayRouter(t, ctx, buffered, func(seq uint64, p []byte) [][]byte { return Frames("", seq, p)[1:] })
}

// replayRouter serves replay requests, framing each answer with frame (the
// end marker too, as frame(-1, nil)).
func replayRouter(t *testing.T, ctx context.Context, buffered map[uint64][]byte, frame func(seq uint64, p []byte) [][]byte) string {
	t.Helper()
	r := zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("replay")))
	if err := r.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	go func() {
		for {
			msg, err := r.Recv()
			if err != nil {
				return
			}
			// [identity, empty, start]
			if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
				continue
			}
			id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
			for seq := start; seq < start+100; seq++ {
				if p, ok := buffered[seq]; ok {
					r.Send(zmq4.NewMsgFrom(append([][]byte{id, {}}, frame(seq, p)...)...))
				}
			}
			r.Send(zmq4.NewMsgFrom(append([][]byte{id, {}}, frame(endSeq, []byte{})...)...))
		}
	}()
	return "tcp://" + r.Addr().String()
}

func TestSubscriberReplaysGaps(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := newPublisher(t, ctx, "127.0.0.1:0")
	defer pub.sock.Close()
	// The replay buffer holds batches 2 and 3 but no longer 1.
	replayEP := replayServer(t, ctx, map[uint64][]byte{
		2: encMapBatch(t, 2, storedEv{hashes: []any{uint64(20)}}),
		3: encArrayBatch(t, 3, storedEv{hashes: []any{uint64(30), uint64(31)}}),
	})
	log, logs := newLog()
	tr := &Tracker{}
	sub := &Subscriber{Endpoint: pub.ep, ReplayEndpoint: replayEP, Tracker: tr, Log: log}
	go sub.Run(ctx)
	pub.waitSubscriber()
	pub.send(0, encArrayBatch(t, 1, storedEv{hashes: []any{uint64(1)}}))
	pub.send(4, encArrayBatch(t, 4, storedEv{hashes: []any{uint64(40)}}))
	testenv.WaitFor(t, "batch 4", func() bool { n, _ := tr.Next(); return n == 5 })
	st := tr.Stats()
	if st.Replayed != 2 || st.Gaps != 1 || st.MissedBatches != 1 {
		t.Errorf("stats = %+v, want 2 replayed and 1 batch still missing", st)
	}
	for _, h := range []uint64{1, 20, 30, 31, 40} {
		if !tr.Has(IntHash(h)) {
			t.Errorf("block %d not tracked", h)
		}
	}
	if !strings.Contains(logs(), "gap filled from the replay socket") {
		t.Errorf("log:\n%s", logs())
	}
	// A gap whose batches are all still buffered leaves no gap at all.
	tr2 := &Tracker{}
	replay2 := replayServer(t, ctx, map[uint64][]byte{6: encArrayBatch(t, 6, storedEv{hashes: []any{uint64(60)}})})
	pub2 := newPublisher(t, ctx, "127.0.0.1:0")
	defer pub2.sock.Close()
	go (&Subscriber{Endpoint: pub2.ep, ReplayEndpoint: replay2, Tracker: tr2, Log: log}).Run(ctx)
	pub2.waitSubscriber()
	pub2.send(5, encArrayBatch(t, 5, "AllBlocksCleared"))
	pub2.send(7, encArrayBatch(t, 7, storedEv{hashes: []any{uint64(70)}}))
	testenv.WaitFor(t, "batch 7", func() bool { n, _ := tr2.Next(); return n == 8 })
	if st := tr2.Stats(); st.Gaps != 0 || st.Replayed != 1 || !tr2.Has(IntHash(60)) {
		t.Errorf("stats = %+v", st)
	}
	// A dead replay socket: the gap is counted, nothing else breaks.
	tr3 := &Tracker{}
	pub3 := newPublisher(t, ctx, "127.0.0.1:0")
	defer pub3.sock.Close()
	go (&Subscriber{Endpoint: pub3.ep, ReplayEndpoint: "tcp://127.0.0.1:1", ReplayTimeout: 200 * time.Millisecond, Tracker: tr3, Log: log}).Run(ctx)
	pub3.waitSubscriber()
	pub3.send(0, encArrayBatch(t, 1, "AllBlocksCleared"))
	pub3.send(3, encArrayBatch(t, 1, storedEv{hashes: []any{uint64(3)}}))
	testenv.WaitFor(t, "batch 3", func() bool { n, _ := tr3.Next(); return n == 4 })
	if st := tr3.Stats(); st.Gaps != 1 || st.MissedBatches != 2 || !tr3.Has(IntHash(3)) {
		t.Errorf("dead replay: stats = %+v", st)
	}
	if !strings.Contains(logs(), "KV event replay failed") {
		t.Errorf("replay failure not logged")
	}
}

// vLLM's ZmqEventPublisher.offset_endpoint_port: rank r publishes on the
// configured port plus r (replay likewise); inproc endpoints get _dp<r>.
func TestRankEndpoint(t *testing.T) {
	for _, c := range []struct {
		ep   string
		rank int
		want string
	}{
		{"tcp://10.0.0.7:5557", 0, "tcp://10.0.0.7:5557"},
		{"tcp://10.0.0.7:5557", 3, "tcp://10.0.0.7:5560"},
		{"tcp://[fd00::7]:5557", 1, "tcp://[fd00::7]:5558"},
		{"inproc://cache", 2, "inproc://cache_dp2"},
		{"", 2, ""},
	} {
		if got, err := RankEndpoint(c.ep, c.rank); err != nil || got != c.want {
			t.Errorf("RankEndpoint(%q, %d) = %q, %v; want %q", c.ep, c.rank, got, err, c.want)
		}
	}
	for _, ep := range []string{"tcp://10.0.0.7", "tcp://10.0.0.7:65535", "tcp://10.0.0.7:x"} {
		if got, err := RankEndpoint(ep, 1); err == nil {
			t.Errorf("RankEndpoint(%q, 1) = %q, want an error", ep, got)
		}
	}
}
