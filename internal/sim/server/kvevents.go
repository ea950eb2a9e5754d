package server

import (
	"context"
	"encoding/binary"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/internal/metricsvc/kvevents"
	"github.com/kvroute/kvroute/internal/sim"
)

// kvPublisher publishes one engine's prefix-cache changes as vLLM does
// with --kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:N"}':
// a PUB socket the subscriber dials, one message per engine step that
// changed the cache, frames [topic, 8-byte big-endian sequence, msgpack
// EventBatch] (kvevents.Encoder, vLLM's encoding). No replay socket: a
// subscriber that misses batches counts a gap, as with a vLLM configured
// without replay_endpoint.
type kvPublisher struct {
	sock zmq4.Socket
	enc  kvevents.Encoder
	// seq is the next batch's sequence number: how many went out, which a
	// test reads while the engine publishes.
	seq   atomic.Uint64
	topic []byte
}

func newKVPublisher(host string, layout kvevents.Layout) (*kvPublisher, error) {
	sock := zmq4.NewPub(context.Background())
	if err := sock.Listen("tcp://" + host + ":0"); err != nil {
		sock.Close()
		return nil, err
	}
	return &kvPublisher{sock: sock, enc: kvevents.Encoder{Layout: layout}}, nil
}

// endpoint is where subscribers dial.
func (p *kvPublisher) endpoint() string { return "tcp://" + p.sock.Addr().String() }

// publish sends one step's events, stamped at the engine's clock.
func (p *kvPublisher) publish(evs []sim.KVEvent, at time.Duration) {
	sim.EncodeKVEvents(&p.enc, evs)
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], p.seq.Add(1)-1)
	// A send error (the socket closed under a stopping server) loses the
	// batch, as a dead engine's would be.
	// A copy: the encoder reuses its buffer, and the socket may send
	// after the next batch is encoded.
	_ = p.sock.Send(zmq4.NewMsgFrom(p.topic, seq[:], slices.Clone(p.enc.Batch(at.Seconds()))))
}

func (p *kvPublisher) close() { p.sock.Close() }
