package kvevents

import (
	"bytes"
	"encoding/binary"

	"github.com/vmihailenco/msgpack/v5"
)

// Layout is one of the two wire layouts of an EventBatch.
type Layout uint8

const (
	// MapLayout is current vLLM's: msgspec Structs without array_like, so
	// the batch is {"ts", "events", "data_parallel_rank"} and each event a
	// map whose "type" key comes first.
	MapLayout Layout = iota
	// ArrayLayout is earlier vLLM's (array_like=True) and
	// llm-d-inference-sim's: the batch is [ts, events, dp_rank] and each
	// event a tagged array of its fields in declaration order.
	ArrayLayout
)

// StoredEvent is what Encode needs of one BlockStored: the hashes, their
// parent, the block size and the number of prompt tokens they hold. The
// token ids are written as zeros: a simulator has no token ids, and a
// reader of this package never looks at their values.
type StoredEvent struct {
	Hashes    []uint64
	Parent    uint64 // with HasParent
	HasParent bool
	BlockSize int
	Tokens    int
}

// Encoder writes EventBatches the way vLLM's publisher does (msgspec's
// msgpack encoder over vllm.distributed.kv_events' Structs): the same field
// order, the same omissions of defaulted fields, integers in their shortest
// form. The simulator's engines publish with it, so the subscriber decodes
// exactly what it decodes from a real engine. One Encoder is reused across
// batches and is not safe for concurrent use.
type Encoder struct {
	Layout Layout
	// Rank is the batches' data_parallel_rank: the publishing engine's
	// data-parallel rank (vLLM runs one publisher per rank).
	Rank   int
	buf    bytes.Buffer
	enc    *msgpack.Encoder
	events int
	body   bytes.Buffer // the events encoded so far
	ebody  *msgpack.Encoder
}

func (e *Encoder) init() {
	if e.enc == nil {
		e.enc = msgpack.NewEncoder(&e.buf)
		e.ebody = msgpack.NewEncoder(&e.body)
	}
}

// Len is the number of events added since the last Batch.
func (e *Encoder) Len() int { return e.events }

// Stored adds a BlockStored event with medium "GPU".
func (e *Encoder) Stored(ev StoredEvent) {
	e.init()
	w := e.ebody
	// BlockStored: block_hashes, parent_block_hash, token_ids, block_size,
	// lora_id, medium, lora_name (later fields default).
	e.event("BlockStored", 8)
	e.field(w, "block_hashes")
	e.hashes(ev.Hashes)
	e.field(w, "parent_block_hash")
	if ev.HasParent {
		w.EncodeUint(ev.Parent)
	} else {
		w.EncodeNil()
	}
	e.field(w, "token_ids")
	w.EncodeArrayLen(ev.Tokens)
	for range ev.Tokens {
		w.EncodeUint(0)
	}
	e.field(w, "block_size")
	w.EncodeInt(int64(ev.BlockSize))
	e.field(w, "lora_id")
	w.EncodeNil()
	e.field(w, "medium")
	w.EncodeString("GPU")
	e.field(w, "lora_name")
	w.EncodeNil()
	e.events++
}

// Removed adds a BlockRemoved event with medium "GPU".
func (e *Encoder) Removed(hashes []uint64) {
	e.init()
	e.event("BlockRemoved", 3)
	e.field(e.ebody, "block_hashes")
	e.hashes(hashes)
	e.field(e.ebody, "medium")
	e.ebody.EncodeString("GPU")
	e.events++
}

// Cleared adds an AllBlocksCleared event.
func (e *Encoder) Cleared() {
	e.init()
	e.event("AllBlocksCleared", 1)
	e.events++
}

// record starts a msgspec Struct of n fields (its tag counted): an array
// in ArrayLayout, a map in MapLayout.
func (e *Encoder) record(w *msgpack.Encoder, n int) {
	if e.Layout == ArrayLayout {
		w.EncodeArrayLen(n)
	} else {
		w.EncodeMapLen(n)
	}
}

// field writes a field's name, which only MapLayout carries (ArrayLayout's
// fields are known by position).
func (e *Encoder) field(w *msgpack.Encoder, name string) {
	if e.Layout == MapLayout {
		w.EncodeString(name)
	}
}

// event starts a tagged event of n fields (the tag counted): the tag is
// the first element in ArrayLayout, the field "type" in MapLayout.
func (e *Encoder) event(tag string, n int) {
	e.record(e.ebody, n)
	if e.Layout != ArrayLayout {
		e.ebody.EncodeString("type")
	}
	e.ebody.EncodeString(tag)
}

func (e *Encoder) hashes(hs []uint64) {
	e.ebody.EncodeArrayLen(len(hs))
	for _, h := range hs {
		e.ebody.EncodeUint(h)
	}
}

// Batch returns the payload of an EventBatch holding the events added
// since the last call (ts in seconds, data_parallel_rank Rank as vLLM's
// publisher fills it) and starts a new one. The slice is valid until the
// next call.
func (e *Encoder) Batch(ts float64) []byte {
	e.init()
	e.buf.Reset()
	e.record(e.enc, 3)
	if e.Layout != ArrayLayout {
		e.enc.EncodeString("ts")
	}
	e.enc.EncodeFloat64(ts)
	e.field(e.enc, "events")
	e.enc.EncodeArrayLen(e.events)
	e.buf.Write(e.body.Bytes())
	e.field(e.enc, "data_parallel_rank")
	e.enc.EncodeInt(int64(e.Rank))
	e.body.Reset()
	e.events = 0
	return e.buf.Bytes()
}

// Frames returns a batch's message as vLLM's publisher sends it:
// [topic, 8-byte big-endian seq, payload].
func Frames(topic string, seq uint64, payload []byte) [][]byte {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	return [][]byte{[]byte(topic), s[:], payload}
}
