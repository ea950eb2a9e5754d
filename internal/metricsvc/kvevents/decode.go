// Package kvevents follows the KV cache of vLLM engines through the events
// they publish on ZMQ, so the gateway can learn which blocks a host holds
// from the engine itself rather than only from its own routing decisions.
//
// The model: each engine runs a ZMQ PUB socket. Every message has three
// frames: a topic, an 8-byte big-endian sequence number and a msgpack
// EventBatch. A batch carries BlockStored, BlockRemoved and AllBlocksCleared
// events. A Subscriber dials one engine, decodes its batches (Decode) and
// applies them to that host's Tracker, which keeps the set of blocks the
// engine holds. Sequence numbers are checked: a jump forward is a gap
// (batches lost, counted and logged), a jump backward is a restarted
// publisher (the engine's cache is empty again, so the tracker is cleared).
//
// vLLM has used two wire layouts over time, and both are decoded:
//   - array layout: the batch is [ts, events, dp_rank?] and each event is a
//     tagged array whose first element names the type, followed by the
//     fields in declaration order ("BlockStored", hashes, parent, tokens,
//     block size, lora id, medium, ...);
//   - map layout: the batch is {"ts":..., "events":[...]} and each event is a
//     map whose "type" key names it.
//
// Block hashes are 64-bit integers or byte strings depending on the engine's
// settings; both are kept as opaque keys. Token ids travel in BlockStored but
// are prompt content: only their number is kept (Event.Tokens).
package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is the type of one KV cache event.
type Kind uint8

const (
	// Unknown is an event whose type tag this decoder does not know; it is
	// skipped and counted, so a newer engine does not break the subscriber.
	Unknown Kind = iota
	BlockStored
	BlockRemoved
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// BlockHash is an engine block hash kept as an opaque map key. Integer hashes
// are stored as 'i' plus 8 big-endian bytes, byte-string hashes as 'b' plus
// the bytes, so the two kinds never collide.
type BlockHash string

// IntHash returns the key of an integer block hash.
func IntHash(v uint64) BlockHash {
	var b [9]byte
	b[0] = 'i'
	binary.BigEndian.PutUint64(b[1:], v)
	return BlockHash(b[:])
}

// BytesHash returns the key of a byte-string block hash.
func BytesHash(v []byte) BlockHash { return BlockHash("b" + string(v)) }

// Event is one decoded KV cache event, reduced to what tracking needs.
type Event struct {
	Kind Kind
	// Tag is the type name as sent, kept for Unknown events' logs.
	Tag    string
	Hashes []BlockHash
	// Parent is BlockStored's parent_block_hash: the engine block the
	// stored ones continue ("" for the start of a prompt, or when the
	// engine does not say).
	Parent BlockHash
	// BlockSize is BlockStored's tokens per block (0 when not sent, as
	// llm-d-inference-sim does not); Tokens is how many token ids it
	// carried. The ids themselves are prompt content and are never kept.
	BlockSize, Tokens int
	// Medium is where the blocks live ("GPU", "CPU", ...); empty means the
	// engine did not say, which vLLM uses for GPU.
	Medium string
	// GroupIdx is the KV cache group of hybrid models (0 otherwise).
	GroupIdx int
}

// Batch is one decoded EventBatch.
type Batch struct {
	TS     float64
	Events []Event
	// DataParallelRank is the publishing engine's DP rank, -1 when absent.
	DataParallelRank int
}

// ErrMalformed wraps every decoding failure, so callers can count them apart
// from transport errors.
var ErrMalformed = errors.New("malformed KV event batch")

// Decode parses one msgpack EventBatch payload in either wire layout.
func Decode(payload []byte) (Batch, error) {
	r := bytes.NewReader(payload)
	d := msgpack.NewDecoder(r)
	dec := decoder{d: d, r: r}
	b, err := dec.batch()
	if err != nil {
		return Batch{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if r.Len() != 0 {
		return Batch{}, fmt.Errorf("%w: %d trailing bytes after the batch", ErrMalformed, r.Len())
	}
	return b, nil
}

type decoder struct {
	d *msgpack.Decoder
	r *bytes.Reader
}

// length checks a container length against the bytes left: every element
// takes at least one byte, so a larger count is garbage and must not drive
// a long loop or a big allocation.
func (c decoder) length(n int, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	if n > c.r.Len() {
		return 0, fmt.Errorf("container claims %d elements with %d bytes left", n, c.r.Len())
	}
	return n, nil
}

func (c decoder) isArray() (bool, error) {
	code, err := c.d.PeekCode()
	if err != nil {
		return false, err
	}
	switch {
	case msgpcode.IsFixedArray(code) || code == msgpcode.Array16 || code == msgpcode.Array32:
		return true, nil
	case msgpcode.IsFixedMap(code) || code == msgpcode.Map16 || code == msgpcode.Map32:
		return false, nil
	}
	return false, fmt.Errorf("expected an array or a map, got msgpack code 0x%02x", code)
}

func (c decoder) batch() (Batch, error) {
	b := Batch{DataParallelRank: -1}
	arr, err := c.isArray()
	if err != nil {
		return b, fmt.Errorf("batch: %v", err)
	}
	if arr {
		n, err := c.length(c.d.DecodeArrayLen())
		if err != nil {
			return b, err
		}
		if n < 2 {
			return b, fmt.Errorf("batch array has %d elements, want at least 2 (ts, events)", n)
		}
		if b.TS, err = c.d.DecodeFloat64(); err != nil {
			return b, fmt.Errorf("batch ts: %v", err)
		}
		if b.Events, err = c.events(); err != nil {
			return b, err
		}
		if n >= 3 {
			if b.DataParallelRank, err = c.optInt(); err != nil {
				return b, fmt.Errorf("batch data_parallel_rank: %v", err)
			}
		}
		for i := 3; i < n; i++ {
			if err := c.d.Skip(); err != nil {
				return b, err
			}
		}
		return b, nil
	}
	n, err := c.length(c.d.DecodeMapLen())
	if err != nil {
		return b, err
	}
	sawEvents := false
	for i := 0; i < n; i++ {
		key, err := c.d.DecodeString()
		if err != nil {
			return b, fmt.Errorf("batch key: %v", err)
		}
		switch key {
		case "ts":
			if b.TS, err = c.d.DecodeFloat64(); err != nil {
				return b, fmt.Errorf("batch ts: %v", err)
			}
		case "events":
			if b.Events, err = c.events(); err != nil {
				return b, err
			}
			sawEvents = true
		case "data_parallel_rank":
			if b.DataParallelRank, err = c.optInt(); err != nil {
				return b, fmt.Errorf("batch data_parallel_rank: %v", err)
			}
		default:
			err = c.d.Skip()
		}
		if err != nil {
			return b, err
		}
	}
	if !sawEvents {
		return b, errors.New("batch map has no \"events\" key")
	}
	return b, nil
}

func (c decoder) events() ([]Event, error) {
	n, err := c.length(c.d.DecodeArrayLen())
	if err != nil {
		return nil, fmt.Errorf("events: %v", err)
	}
	if n < 0 {
		return nil, nil
	}
	evs := make([]Event, 0, n)
	for i := 0; i < n; i++ {
		ev, err := c.event()
		if err != nil {
			return nil, fmt.Errorf("event %d: %v", i, err)
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

func kindOf(tag string) Kind {
	switch tag {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return Unknown
}

// Field positions in the array layout, after the tag, in vLLM's declaration
// order. Fields past the ones listed are skipped.
const (
	storedHashes   = 0
	storedParent   = 1
	storedTokens   = 2
	storedSize     = 3
	storedMedium   = 5
	storedGroupIdx = 8
	removedHashes  = 0
	removedMedium  = 1
	removedGroup   = 2
)

func (c decoder) event() (Event, error) {
	var ev Event
	arr, err := c.isArray()
	if err != nil {
		return ev, err
	}
	if arr {
		n, err := c.length(c.d.DecodeArrayLen())
		if err != nil {
			return ev, err
		}
		if n < 1 {
			return ev, errors.New("empty event array (no type tag)")
		}
		if ev.Tag, err = c.d.DecodeString(); err != nil {
			return ev, fmt.Errorf("type tag: %v", err)
		}
		ev.Kind = kindOf(ev.Tag)
		for i := 0; i < n-1; i++ {
			if err := c.arrayField(&ev, i); err != nil {
				return ev, fmt.Errorf("%s field %d: %v", ev.Tag, i, err)
			}
		}
		return ev, nil
	}
	n, err := c.length(c.d.DecodeMapLen())
	if err != nil {
		return ev, err
	}
	// The tag usually comes first, but nothing requires it: collect every
	// field, then decide.
	var hashes []BlockHash
	var parent BlockHash
	var size, tokens int
	sawType := false
	for i := 0; i < n; i++ {
		key, err := c.d.DecodeString()
		if err != nil {
			return ev, fmt.Errorf("event key: %v", err)
		}
		switch key {
		case "type":
			ev.Tag, err = c.d.DecodeString()
			sawType = true
		case "block_hashes":
			hashes, err = c.hashes()
		case "parent_block_hash":
			parent, err = c.optHash()
		case "token_ids":
			tokens, err = c.countSkip()
		case "block_size":
			size, err = c.optInt()
		case "medium":
			ev.Medium, err = c.optString()
		case "group_idx":
			ev.GroupIdx, err = c.optInt()
		default:
			err = c.d.Skip()
		}
		if err != nil {
			return ev, fmt.Errorf("event field %q: %v", key, err)
		}
	}
	if !sawType {
		return ev, errors.New("event map has no \"type\" key")
	}
	ev.Kind = kindOf(ev.Tag)
	if ev.Kind == BlockStored || ev.Kind == BlockRemoved {
		ev.Hashes = hashes
	}
	if ev.Kind == BlockStored {
		ev.Parent, ev.BlockSize, ev.Tokens = parent, max(size, 0), tokens
	}
	if ev.GroupIdx < 0 {
		ev.GroupIdx = 0
	}
	return ev, nil
}

func (c decoder) arrayField(ev *Event, i int) error {
	var err error
	switch {
	case ev.Kind == BlockStored && i == storedHashes, ev.Kind == BlockRemoved && i == removedHashes:
		ev.Hashes, err = c.hashes()
	case ev.Kind == BlockStored && i == storedParent:
		ev.Parent, err = c.optHash()
	case ev.Kind == BlockStored && i == storedTokens:
		ev.Tokens, err = c.countSkip()
	case ev.Kind == BlockStored && i == storedSize:
		ev.BlockSize, err = c.optInt()
		ev.BlockSize = max(ev.BlockSize, 0)
	case ev.Kind == BlockStored && i == storedMedium, ev.Kind == BlockRemoved && i == removedMedium:
		ev.Medium, err = c.optString()
	case ev.Kind == BlockStored && i == storedGroupIdx, ev.Kind == BlockRemoved && i == removedGroup:
		ev.GroupIdx, err = c.optInt()
		if ev.GroupIdx < 0 {
			ev.GroupIdx = 0
		}
	default:
		// token ids among them: prompt content, never decoded.
		err = c.d.Skip()
	}
	return err
}

func (c decoder) hashes() ([]BlockHash, error) {
	n, err := c.length(c.d.DecodeArrayLen())
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, nil
	}
	out := make([]BlockHash, 0, n)
	for i := 0; i < n; i++ {
		h, err := c.hash()
		if err != nil {
			return nil, fmt.Errorf("block hash %d: %v", i, err)
		}
		out = append(out, h)
	}
	return out, nil
}

func (c decoder) hash() (BlockHash, error) {
	code, err := c.d.PeekCode()
	if err != nil {
		return "", err
	}
	switch {
	case msgpcode.IsBin(code) || msgpcode.IsString(code):
		b, err := c.d.DecodeBytes()
		if err != nil {
			return "", err
		}
		return BytesHash(b), nil
	case code == msgpcode.Uint64 || code == msgpcode.Uint32 || code == msgpcode.Uint16 || code == msgpcode.Uint8:
		v, err := c.d.DecodeUint64()
		return IntHash(v), err
	case msgpcode.IsFixedNum(code) || code == msgpcode.Int8 || code == msgpcode.Int16 ||
		code == msgpcode.Int32 || code == msgpcode.Int64:
		v, err := c.d.DecodeInt64()
		return IntHash(uint64(v)), err
	}
	return "", fmt.Errorf("block hash must be an integer or bytes, got msgpack code 0x%02x", code)
}

// optHash decodes a block hash or nil (returned as "").
func (c decoder) optHash() (BlockHash, error) {
	code, err := c.d.PeekCode()
	if err != nil {
		return "", err
	}
	if code == msgpcode.Nil {
		return "", c.d.DecodeNil()
	}
	return c.hash()
}

// countSkip counts an array's elements and skips them (token ids: their
// number matters, their values are prompt content). nil counts 0.
func (c decoder) countSkip() (int, error) {
	code, err := c.d.PeekCode()
	if err != nil {
		return 0, err
	}
	if code == msgpcode.Nil {
		return 0, c.d.DecodeNil()
	}
	n, err := c.length(c.d.DecodeArrayLen())
	if err != nil {
		return 0, err
	}
	for i := 0; i < n; i++ {
		if err := c.d.Skip(); err != nil {
			return 0, err
		}
	}
	return max(n, 0), nil
}

// optInt decodes an int or nil (returned as -1).
func (c decoder) optInt() (int, error) {
	code, err := c.d.PeekCode()
	if err != nil {
		return 0, err
	}
	if code == msgpcode.Nil {
		return -1, c.d.DecodeNil()
	}
	v, err := c.d.DecodeInt64()
	return int(v), err
}

// optString decodes a string or nil (returned as "").
func (c decoder) optString() (string, error) {
	code, err := c.d.PeekCode()
	if err != nil {
		return "", err
	}
	if code == msgpcode.Nil {
		return "", c.d.DecodeNil()
	}
	return c.d.DecodeString()
}
