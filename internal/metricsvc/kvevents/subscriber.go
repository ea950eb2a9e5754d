package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/internal/metricsvc/internal/ratelog"
)

// Subscriber follows one engine's KV event publisher and applies what it
// receives to Tracker. It owns its reconnection: zmq4's own automatic
// reconnect dials synchronously from inside the socket, so instead a dead
// connection closes the socket and Run dials a fresh one after a backoff.
type Subscriber struct {
	// Endpoint is the engine's PUB address, e.g. tcp://10.0.0.7:5557.
	Endpoint string
	// Topic filters messages by prefix; empty takes all (vLLM's default
	// topic is empty).
	Topic string
	// ReplayEndpoint is the engine's replay socket (vLLM's
	// replay_endpoint, a ROUTER), e.g. tcp://10.0.0.7:5558. When set, a
	// sequence gap is filled by asking it for the missed batches before
	// the batch that revealed the gap is applied. Empty: gaps are only
	// counted and logged.
	ReplayEndpoint string
	// ReplayTimeout bounds one replay (default 1 s); live batches wait
	// meanwhile.
	ReplayTimeout time.Duration
	Tracker       *Tracker
	// Ranks, when set, picks the tracker of a batch's data-parallel rank
	// (Batch.DataParallelRank, 0 when the batch names none): one socket
	// that carries several ranks' publishers (listen mode), each with its
	// own sequence. nil for a rank the engine does not have: the batch is
	// dropped and counted (UnknownRanks). A gap is replayed from
	// ReplayEndpoint's port plus the rank, as vLLM offsets it (RankEndpoint).
	// Unset: every batch goes to Tracker (one publisher per Subscriber).
	Ranks func(rank int) *Tracker
	Log   *slog.Logger
	// OnChange, when set, is called after each applied batch (the service
	// uses it to assemble and push a new snapshot).
	OnChange func()
	// OnBatch, when set, receives each applied batch (replayed ones too)
	// with how its sequence number related to the previous one, before
	// OnChange: the service's cache-state bridge reads the events there.
	OnBatch func(Batch, SeqResult)
	// DialTimeout bounds one connection attempt (default 2 s).
	DialTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between attempts
	// (defaults 100 ms and 5 s).
	MinBackoff, MaxBackoff time.Duration

	connected    atomic.Bool
	unknownRanks atomic.Uint64
	limiter      ratelog.Limiter
}

// UnknownRanks counts batches dropped because they named a data-parallel
// rank the engine does not have (Ranks returned nil).
func (s *Subscriber) UnknownRanks() uint64 { return s.unknownRanks.Load() }

// Connected reports whether a connection to the publisher is up.
func (s *Subscriber) Connected() bool { return s.connected.Load() }

// Run subscribes until ctx is done.
func (s *Subscriber) Run(ctx context.Context) {
	log := s.Log
	if log == nil {
		log = slog.Default()
	}
	log = log.With("kv_events", s.Endpoint)
	minB, maxB := s.MinBackoff, s.MaxBackoff
	if minB <= 0 {
		minB = 100 * time.Millisecond
	}
	if maxB <= 0 {
		maxB = 5 * time.Second
	}
	backoff := minB
	for ctx.Err() == nil {
		received, err := s.session(ctx, log)
		s.connected.Store(false)
		if ctx.Err() != nil {
			return
		}
		if received {
			backoff = minB
		}
		s.limiter.Log(log, slog.LevelWarn, "session", "KV event subscription interrupted; reconnecting",
			"err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, maxB)
	}
}

// session dials, subscribes and receives until the connection fails.
// received says whether any message arrived (to reset the backoff).
func (s *Subscriber) session(ctx context.Context, log *slog.Logger) (received bool, err error) {
	dt := s.DialTimeout
	if dt <= 0 {
		dt = 2 * time.Second
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sock := zmq4.NewSub(sctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(dt))
	defer sock.Close()
	if err := sock.Dial(s.Endpoint); err != nil {
		return false, fmt.Errorf("dial %s: %w (check the engine's --kv-events-config endpoint and port)", s.Endpoint, err)
	}
	if err := sock.SetOption(zmq4.OptionSubscribe, s.Topic); err != nil {
		return false, fmt.Errorf("subscribe: %w", err)
	}
	s.connected.Store(true)
	log.Info("KV event subscription up")
	for {
		msg, err := sock.Recv()
		if err != nil {
			return received, err
		}
		received = true
		s.handle(msg.Frames, log)
	}
}

func (s *Subscriber) handle(frames [][]byte, log *slog.Logger) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		s.Tracker.DecodeFailed(0, false)
		s.limiter.Log(log, slog.LevelWarn, "frames", "KV event message is not [topic, 8-byte seq, payload]; dropped",
			"frames", len(frames))
		return
	}
	s.Apply(binary.BigEndian.Uint64(frames[1]), frames[2], log)
}

// Apply decodes one batch with its sequence number and applies it to
// Tracker, filling a gap from the replay socket first when there is one.
// Connect mode (Run) calls it for every message; a Listener calls it for
// the messages whose topic names this subscriber's engine.
func (s *Subscriber) Apply(seq uint64, payload []byte, log *slog.Logger) {
	now := time.Now()
	batch, err := Decode(payload)
	if err != nil {
		// With several ranks on the socket the sequence's rank is unknown:
		// counted on Tracker, checked against none.
		s.Tracker.DecodeFailed(seq, s.Ranks == nil)
		s.limiter.Log(log, slog.LevelWarn, "decode", "KV event batch dropped", "seq", seq, "err", err)
		return
	}
	t, replayEndpoint := s.Tracker, s.ReplayEndpoint
	if s.Ranks != nil {
		rank := max(batch.DataParallelRank, 0)
		if t = s.Ranks(rank); t == nil {
			s.unknownRanks.Add(1)
			s.limiter.Log(log, slog.LevelWarn, "rank", "KV event batch names a data-parallel rank the engine's metrics do not show; dropped",
				"rank", batch.DataParallelRank)
			return
		}
		if replayEndpoint != "" {
			replayEndpoint, _ = RankEndpoint(replayEndpoint, rank)
		}
	}
	if next, ok := t.Next(); ok && seq > next && replayEndpoint != "" {
		n, err := s.replay(t, replayEndpoint, next, seq)
		if err != nil {
			s.limiter.Log(log, slog.LevelWarn, "replay", "KV event replay failed", "from", next, "to", seq-1, "err", err)
		} else {
			log.Info("KV event sequence gap filled from the replay socket", "from", next, "to", seq-1, "replayed", n)
		}
	}
	res := t.Apply(seq, batch, now)
	switch {
	case res.Missed > 0:
		log.Warn("KV event sequence gap: batches lost, cached block counts may drift until the next clear",
			"seq", seq, "missed", res.Missed)
	case res.Restarted:
		log.Info("KV event sequence restarted: engine restarted, its blocks are cleared", "seq", seq)
	}
	s.batchApplied(seq, batch, res)
}

// batchApplied tells OnBatch and OnChange about an applied batch.
func (s *Subscriber) batchApplied(seq uint64, b Batch, res SeqResult) {
	if s.OnBatch != nil {
		s.OnBatch(b, res)
	}
	if s.OnChange != nil {
		s.OnChange()
	}
}

// endSeq is vLLM's end-of-replay marker: -1 as a signed 8-byte integer.
const endSeq = ^uint64(0)

// replay asks the engine's replay socket for batches from..until-1 and
// applies them in order. vLLM's ROUTER takes [empty, 8-byte start] from a
// DEALER and answers [empty, seq, payload] per buffered batch from start
// on, then [empty, -1, ""] (llm-d-inference-sim puts its topic before
// each seq, as on its live stream). Batches it no longer holds stay missing and
// are counted as a gap when the live batch is applied.
func (s *Subscriber) replay(t *Tracker, endpoint string, from, until uint64) (int, error) {
	timeout := s.ReplayTimeout
	if timeout <= 0 {
		timeout = time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	sock := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(timeout))
	defer sock.Close()
	if err := sock.Dial(endpoint); err != nil {
		return 0, fmt.Errorf("dial replay socket %s: %w", endpoint, err)
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := sock.Send(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		return 0, fmt.Errorf("replay request: %w", err)
	}
	replayed := 0
	for {
		msg, err := sock.Recv()
		if err != nil {
			return replayed, fmt.Errorf("replay answer after %d batches: %w", replayed, err)
		}
		frames := msg.Frames
		for len(frames) > 0 && len(frames[0]) == 0 {
			frames = frames[1:] // the DEALER's empty delimiter (and an empty topic)
		}
		// vLLM answers [seq, payload]; llm-d-inference-sim answers as it
		// publishes, [topic, seq, payload].
		if len(frames) == 3 && len(frames[1]) == 8 {
			frames = frames[1:]
		}
		if len(frames) < 1 || len(frames[0]) != 8 {
			return replayed, errors.New("replay answer is neither [seq, payload] nor [topic, seq, payload]")
		}
		seq := binary.BigEndian.Uint64(frames[0])
		if seq == endSeq || seq >= until {
			return replayed, nil
		}
		if seq < from || len(frames) < 2 {
			continue
		}
		if next, ok := t.Next(); ok && seq < next {
			continue // already applied
		}
		b, err := Decode(frames[1])
		if err != nil {
			t.DecodeFailed(seq, true)
			continue
		}
		res := t.Apply(seq, b, time.Now())
		t.Replayed()
		replayed++
		if s.OnBatch != nil {
			s.OnBatch(b, res)
		}
	}
}

// RankEndpoint is the address data-parallel rank rank of an engine
// publishes on when its configured endpoint is endpoint: vLLM (and SGLang,
// which uses vLLM's publisher) runs one publisher per rank and offsets the
// TCP port by the rank (ZmqEventPublisher.offset_endpoint_port), the replay
// endpoint likewise; an inproc endpoint gets "_dp<rank>". Rank 0 is the
// endpoint itself.
func RankEndpoint(endpoint string, rank int) (string, error) {
	if rank == 0 || endpoint == "" {
		return endpoint, nil
	}
	if strings.HasPrefix(endpoint, "inproc://") {
		return endpoint + "_dp" + strconv.Itoa(rank), nil
	}
	i := strings.LastIndexByte(endpoint, ':')
	port, err := strconv.Atoi(endpoint[i+1:])
	if i < 0 || err != nil || port <= 0 || port+rank > 65535 {
		return "", fmt.Errorf("KV events endpoint %q has no TCP port to offset by data-parallel rank %d", endpoint, rank)
	}
	return endpoint[:i+1] + strconv.Itoa(port+rank), nil
}
