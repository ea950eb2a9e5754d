package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/internal/metricsvc/internal/ratelog"
)

// Listener is the other way engines publish: llm-d-inference-sim and
// llm-d's stack connect their PUB socket out to a subscriber that binds,
// and all of them send on the one socket, each under its own topic
// kv@<pod-ip>@<model>. The Listener binds a SUB socket and hands each
// message to the Subscriber that Route returns for its topic, which checks
// that engine's sequence and applies the batch to its Tracker (Subscriber's
// Run is not started for such engines).
type Listener struct {
	// Endpoint is the address to bind, e.g. tcp://*:5557.
	Endpoint string
	// Topic filters messages by prefix; empty takes all.
	Topic string
	// Route returns the engine a topic names, or nil for a topic of no
	// known engine (the message is counted and dropped).
	Route func(topic string) *Subscriber
	Log   *slog.Logger

	unrouted, malformed atomic.Uint64
	addr                atomic.Value // string
	limiter             ratelog.Limiter
}

// Unrouted counts messages whose topic named no known engine; Malformed
// counts messages that were not [topic, 8-byte seq, payload].
func (l *Listener) Unrouted() uint64  { return l.unrouted.Load() }
func (l *Listener) Malformed() uint64 { return l.malformed.Load() }

// Run binds and receives until ctx is done. It returns an error only when
// the endpoint cannot be bound.
func (l *Listener) Run(ctx context.Context) error {
	log := l.Log
	if log == nil {
		log = slog.Default()
	}
	log = log.With("kv_events_listen", l.Endpoint)
	sock := zmq4.NewSub(ctx)
	defer sock.Close()
	if err := sock.Listen(l.Endpoint); err != nil {
		return fmt.Errorf("listen for KV events on %s: %w (is the port free? engines connect to it with --kv-events-config endpoint)", l.Endpoint, err)
	}
	if err := sock.SetOption(zmq4.OptionSubscribe, l.Topic); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	l.addr.Store("tcp://" + sock.Addr().String())
	log.Info("listening for KV event publishers", "addr", sock.Addr().String())
	for {
		msg, err := sock.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			l.limiter.Log(log, slog.LevelWarn, "recv", "KV event listener receive failed", "err", err)
			continue
		}
		l.handle(msg.Frames, log)
	}
}

// Addr is the bound address once Run is listening ("" before), for an
// endpoint with port 0.
func (l *Listener) Addr() string {
	a, _ := l.addr.Load().(string)
	return a
}

func (l *Listener) handle(frames [][]byte, log *slog.Logger) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		l.malformed.Add(1)
		l.limiter.Log(log, slog.LevelWarn, "frames", "KV event message is not [topic, 8-byte seq, payload]; dropped",
			"frames", len(frames))
		return
	}
	topic := string(frames[0])
	sub := l.Route(topic)
	if sub == nil {
		l.unrouted.Add(1)
		l.limiter.Log(log, slog.LevelWarn, "route", "KV events from an engine discovery does not list; dropped",
			"topic", topic)
		return
	}
	sl := sub.Log
	if sl == nil {
		sl = log
	}
	sub.connected.Store(true) // the engine publishes to this socket: its stream is up
	sub.Apply(binary.BigEndian.Uint64(frames[1]), frames[2], sl)
}

// ParseTopic splits llm-d's topic kv@<pod-ip>@<model> into the pod's IP and
// the model. ok is false for any other form.
func ParseTopic(topic string) (ip, model string, ok bool) {
	rest, found := strings.CutPrefix(topic, "kv@")
	if !found {
		return "", "", false
	}
	ip, model, found = strings.Cut(rest, "@")
	if !found || ip == "" {
		return "", "", false
	}
	return ip, model, true
}
