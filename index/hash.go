package index

import (
	"encoding/binary"
	"slices"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// HashConfig sets how prompts are cut into blocks. Every gateway VM and
// every tool that records into the same shared index must use the same
// values, or their block hashes never meet.
type HashConfig struct {
	// BlockChars is the size in bytes of the canonical prompt string
	// covered by one block at the start of a prompt (level 0). Default
	// DefaultBlockChars.
	BlockChars int
	// LevelBlocks is the number of blocks per resolution level: blocks
	// [0, LevelBlocks) have BlockChars bytes, the next LevelBlocks have
	// twice that, and so on, so a prompt of n bytes needs
	// O(LevelBlocks * log(n)) blocks instead of n/BlockChars, and a partial
	// match loses at most about 1/LevelBlocks of the matched prefix.
	// Zero uses DefaultLevelBlocks; a negative value keeps every block at
	// BlockChars.
	LevelBlocks int
	// MaxLevel caps the doubling (block size at most BlockChars << MaxLevel).
	// Zero uses DefaultMaxLevel; at most 15.
	MaxLevel int
	// CharsPerToken converts canonical bytes to estimated tokens. Token-id
	// prompts are encoded as 4 bytes per id, so 4 (the default) is exact
	// for them and the usual English estimate for text.
	CharsPerToken int
}

// Defaults, chosen with BenchmarkLayout (docs/index.md, "Default block size").
const (
	DefaultBlockChars    = 256
	DefaultLevelBlocks   = 32
	DefaultMaxLevel      = 8
	DefaultCharsPerToken = 4
)

func (c HashConfig) withDefaults() HashConfig {
	if c.BlockChars <= 0 {
		c.BlockChars = DefaultBlockChars
	}
	if c.LevelBlocks == 0 {
		c.LevelBlocks = DefaultLevelBlocks
	}
	if c.MaxLevel <= 0 {
		c.MaxLevel = DefaultMaxLevel
	}
	if c.MaxLevel > 15 { // the index stores a block's level in 4 bits
		c.MaxLevel = 15
	}
	if c.CharsPerToken <= 0 {
		c.CharsPerToken = DefaultCharsPerToken
	}
	return c
}

// WithDefaults returns c with its zero fields set to the defaults, as the
// index and the Hasher use it.
func (c HashConfig) WithDefaults() HashConfig { return c.withDefaults() }

// BlockSizeAt returns the canonical byte length of block i of a chain.
func (c HashConfig) BlockSizeAt(i int) int { return c.withDefaults().blockSize(i) }

// BlocksIn returns how many leading blocks of a chain lie wholly within
// its first chars canonical bytes: the depth a prefix of that length
// reaches (a count of cached tokens times the characters per token, say).
func (c HashConfig) BlocksIn(chars int) int {
	c = c.withDefaults()
	n := 0
	for end := 0; ; n++ {
		end += c.blockSize(n)
		if end > chars || n >= 1<<20 {
			return n
		}
	}
}

// blockSize returns the byte length of block i.
func (c HashConfig) blockSize(i int) int {
	if c.LevelBlocks < 0 {
		return c.BlockChars
	}
	level := i / c.LevelBlocks
	if level > c.MaxLevel {
		level = c.MaxLevel
	}
	return c.BlockChars << level
}

// Record tags of the canonical chat serialization. Each chat element is
// tag, uvarint length, bytes: injective (no content can imitate a
// boundary) and prefix-stable, because an element's bytes depend only on
// that element. Raw prompt text (completions) is appended without a length
// so that a prompt that grows shares its leading blocks.
const (
	kindChat   = 'c'
	kindText   = 't'
	kindTokens = 'k'

	tagMessage  = 'M'
	tagText     = 'T'
	tagPart     = 'P'
	tagToolCall = 'C'
	tagField    = 'F'
)

// Hasher turns one prompt into its chain of block hashes,
// h_i = xxhash64(h_{i-1} || xxhash64(block_i)) (both as 8 bytes, little
// endian), with h_{-1} derived from the model, LoRA adapter and cache salt
// so different models never share a block. Hashing each block on its own
// and then the 16-byte pair, rather than the block with the previous hash
// as XXH64's seed, lets every block go through xxhash's one-shot Sum64 (its
// assembly natively): a seeded hash needs an xxhash.Digest, whose reset,
// write and sum calls per block cost as much as hashing the block's 256
// bytes in Go's Wasm port.
//
// It is a streaming builder: the filter feeds fields as gjson finds them
// (Message, Text, Token, ...) and the Hasher hashes each block as soon as
// its bytes have arrived, keeping at most the current (incomplete) block's
// bytes, never the prompt. A Hasher is reused
// across requests (Reset) and allocates nothing once its block slice has
// grown; it is not safe for concurrent use.
type Hasher struct {
	cfg    HashConfig
	seed   uint64 // hash of model/adapter/salt, the chain's h_{-1}
	prev   uint64 // last completed block hash (or seed)
	kind   byte   // 0 until the first field decides chat/text/tokens
	blkLen int    // size of the current block
	total  int    // canonical bytes written
	blocks []uint64
	ends   []int // ends[i]: canonical bytes covered by blocks[0..i]
	// pend holds the current block's bytes when they did not come from
	// one string that holds the whole block (element headers, short
	// fields, the ends of strings): at most one block, and it is hashed
	// the moment it is complete. Keeping the bytes rather than an
	// xxhash.Digest's running state costs a copy of less than a block per
	// field, and saves the digest's calls per write, which in Go's Wasm
	// port cost more than the copy.
	pend []byte
	scr  [binary.MaxVarintLen64 + 1]byte
	// tok holds a batch of token ids encoded for Tokens. A field rather
	// than a local: a local array escaped (the hash functions view it as
	// a string), and a request of many small token arrays allocated one
	// per array.
	tok [1024]byte
}

// NewHasher returns a Hasher for cfg (zero fields take the defaults).
func NewHasher(cfg HashConfig) *Hasher {
	h := &Hasher{cfg: cfg.withDefaults()}
	h.Reset("", "", "")
	return h
}

// Config returns the effective configuration.
func (h *Hasher) Config() HashConfig { return h.cfg }

// Reset starts a new prompt for the given model, LoRA adapter (empty for
// the base model) and cache salt (empty for none).
func (h *Hasher) Reset(model, adapter, salt string) {
	// The seed is XXH64 (seed 0) of each string preceded by its length
	// as 4 bytes, little endian; pend serves as the scratch buffer.
	h.pend = h.pend[:0]
	for _, s := range [3]string{model, adapter, salt} {
		binary.LittleEndian.PutUint32(h.scr[:4], uint32(len(s)))
		h.put(h.scr[:4], s)
	}
	h.seed = xxhash.Sum64(h.pend)
	h.prev = h.seed
	h.pend = h.pend[:0]
	h.kind = 0
	h.blkLen = h.cfg.BlockChars // blockSize(0): level 0, without its division
	h.total = 0
	h.blocks = h.blocks[:0]
	h.ends = h.ends[:0]
}

// setKind writes the one-byte prompt kind the first time a field arrives,
// so a chat, a text prompt and a token prompt never share blocks. Small
// enough to be inlined: the fields after the first make no call for it.
func (h *Hasher) setKind(k byte) {
	if h.kind == 0 {
		h.writeKind(k)
	}
}

// writeKind is setKind for the first field.
func (h *Hasher) writeKind(k byte) {
	h.kind = k
	h.scr[0] = k
	h.write(h.scr[:1])
}

// Message appends one chat message whose content is a plain string.
// It is BeginMessage(role) followed by Text(content), written out: the
// filter hashes most messages with it, and in Wasm each function a request
// enters, and each call, costs.
func (h *Hasher) Message(role, content string) { h.pair(tagMessage, role, tagText, content) }

// BeginMessage starts a chat message. Follow it with its content parts
// (Text, Part), tool calls (ToolCall) and other fields (Field), in the
// order of the request.
func (h *Hasher) BeginMessage(role string) { h.element(tagMessage, role) }

// Text appends text. In a chat message it is one text content part (a
// string content and an array holding one text part hash alike). Outside
// a message it is raw prompt text (completions): consecutive calls
// concatenate, so a prompt fed in pieces hashes like the whole.
func (h *Hasher) Text(s string) { h.element(textOrRaw, s) }

// Part appends a non-text content part of a chat message, such as an
// image URL or an audio reference: kind names it, value identifies it
// (a URL or a digest of inline data).
func (h *Hasher) Part(kind, value string) { h.pair(tagPart, kind, tagPart, value) }

// ToolCall appends one tool call of an assistant message. Three short
// elements that leave the block incomplete are written in place in one
// go, as in pair: a call per element cost a body of many small tool
// calls more than hashing their bytes.
func (h *Hasher) ToolCall(id, name, arguments string) {
	if n, k := len(h.pend), 6+len(id)+len(name)+len(arguments); len(id)|len(name)|len(arguments) < 0x80 && n+k < h.blkLen && n+k <= cap(h.pend) && h.kind == kindChat {
		h.pend = h.pend[:n+k] // only the length stored: see pair
		putShort(h.pend, putShort(h.pend, putShort(h.pend, n, tagToolCall, id), tagToolCall, name), tagToolCall, arguments)
		h.total += k
		return
	}
	h.pair(tagToolCall, id, tagToolCall, name)
	h.element(tagToolCall, arguments)
}

// putShort writes at p[n:] the element of tag t and text s, shorter than
// 0x80 bytes (its length one varint byte), and returns the index after
// it: the in-place writing of short elements in pair, element and
// ToolCall, whose caller has made p long enough.
func putShort(p []byte, n int, t byte, s string) int {
	p[n], p[n+1] = t, byte(len(s))
	return n + 2 + copy(p[n+2:], s)
}

// Field appends another message field that shapes the prompt, such as a
// tool message's tool_call_id or a message name.
func (h *Hasher) Field(name, value string) { h.pair(tagField, name, tagField, value) }

// Token appends one token id of a token-id prompt (4 bytes, little endian).
func (h *Hasher) Token(id uint32) {
	h.setKind(kindTokens)
	binary.LittleEndian.PutUint32(h.scr[:4], id)
	h.write(h.scr[:4])
}

// Tokens appends token ids; see Token. It encodes them a batch at a time
// and hashes each batch as one write (one call per batch rather than per
// id, and whole blocks straight from the batch).
func (h *Hasher) Tokens(ids []uint32) {
	if littleEndian && len(ids) > 0 {
		// The ids' memory is their encoding: hashed where it is, without
		// the copy into tok (in Wasm the encoding loop cost 3 times the
		// hashing of its bytes).
		h.setKind(kindTokens)
		h.writeString(unsafe.String((*byte)(unsafe.Pointer(unsafe.SliceData(ids))), 4*len(ids)))
		return
	}
	buf := &h.tok
	for len(ids) > 0 {
		h.setKind(kindTokens)
		n := len(ids)
		if n > len(buf)/4 {
			n = len(buf) / 4
		}
		for i, id := range ids[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], id)
		}
		h.writeString(bytesString(buf[:4*n]))
		ids = ids[n:]
	}
}

// pair appends two elements (a message's role and content, a part's kind
// and value). When both are short and leave the block incomplete, as most
// of a body of many small messages or parts are, it writes them in place
// in one go: one call per pair, where two calls to element, each with its
// own tests, cost a body of tiny messages more than hashing its bytes.
func (h *Hasher) pair(t1 byte, a string, t2 byte, b string) {
	if n, k := len(h.pend), 4+len(a)+len(b); len(a)|len(b) < 0x80 && n+k < h.blkLen && n+k <= cap(h.pend) && h.kind == kindChat {
		// h.pend resliced in place, not assigned a new slice: only its
		// length is stored, where storing its pointer is a write
		// barrier's test and, while the collector runs, its call.
		h.pend = h.pend[:n+k]
		putShort(h.pend, putShort(h.pend, n, t1, a), t2, b)
		h.total += k
		return
	}
	h.setKind(kindChat)
	h.element(t1, a)
	h.element(t2, b)
}

// textOrRaw is element's tag for Text: a text element in a chat, raw
// prompt text outside one.
const textOrRaw = 0

// element appends one element of a chat: its tag, its length and s. It
// also takes Text's and BeginMessage's decisions on the prompt's kind, so
// that each is one call (inlined where it is called): a text part or a
// message's role is one call, not two.
func (h *Hasher) element(tag byte, s string) {
	t := tag
	if t == textOrRaw {
		t = tagText
	}
	if n, k := len(h.pend), 2+len(s); len(s) < 0x80 && n+k < h.blkLen && n+k <= cap(h.pend) && h.kind == kindChat {
		// A short element that leaves the block incomplete and fits
		// pend as it is (a role, a name, a short message): written in
		// place, its length one varint byte. In Go's Wasm port put's
		// two appends cost several times the copy.
		h.pend = h.pend[:n+k] // only the length stored: see pair
		putShort(h.pend, n, t, s)
		h.total += k
		return
	}
	if h.kind != kindChat {
		if tag == textOrRaw { // Text outside a chat: raw prompt text
			h.setKind(kindText)
			h.writeString(s)
			return
		}
		h.setKind(kindChat)
	}
	h.scr[0] = t
	n := binary.PutUvarint(h.scr[1:], uint64(len(s)))
	if k := 1 + n + len(s); len(h.pend)+k < h.blkLen {
		// A short element that leaves the block incomplete (a role, a
		// name, a short message): what writeString would do, in one go.
		h.put(h.scr[:1+n], s)
		h.total += k
		return
	}
	h.write(h.scr[:1+n])
	h.writeString(s)
}

func (h *Hasher) write(p []byte) { h.writeString(bytesString(p)) }

// writeString appends s to the prompt, hashing each block as soon as it
// is complete. A block is completed and linked at one place, so a prompt
// of many blocks makes no call per block beyond xxhash's two: in Wasm each
// call and each function entered costs.
func (h *Hasher) writeString(s string) {
	for len(s) > 0 {
		n := h.blkLen - len(h.pend) // the bytes that complete the current block
		if len(s) < n {
			h.put(nil, s)
			h.total += len(s)
			return
		}
		var block string
		if len(h.pend) == 0 {
			// A whole block inside s (most of a long prompt): hashed
			// straight from s, without a copy into pend.
			block = s[:n]
		} else {
			h.put(nil, s[:n])
			block = bytesString(h.pend)
			h.pend = h.pend[:0] // block still views the bytes until it is linked below
		}
		s = s[n:]
		h.total += n
		// The link to the previous block: xxhash64 of the previous hash
		// and the block's own xxhash64, 8 bytes each, little endian.
		// Written out here rather than called: a call per block.
		var pair [16]byte
		binary.LittleEndian.PutUint64(pair[:8], h.prev)
		binary.LittleEndian.PutUint64(pair[8:], xxhash.Sum64String(block))
		h.prev = xxhash.Sum64(pair[:])
		b := len(h.blocks)
		if b == cap(h.blocks) || b == cap(h.ends) {
			h.growBlocks()
		}
		h.blocks, h.ends = h.blocks[:b+1], h.ends[:b+1]
		h.blocks[b], h.ends[b] = h.prev, h.total // ends[i]: bytes covered by blocks[0..i]
		h.blkLen = h.cfg.blockSize(b + 1)
	}
}

// put appends head and s to pend. One function for the appends to pend of
// Reset, element and writeString, which a request enters for every element
// and block: in Go's Wasm port an append is ~170 instructions (the call
// that grows the array, the write barrier that stores it, the copy), and
// each one inlined where it is used would be code every request enters
// (docs/performance.md). Two
// pieces in one call: an element is its header and its text, and a seed
// string its length and its bytes.
//
//go:noinline
func (h *Hasher) put(head []byte, s string) { h.pend = append(append(h.pend, head...), s...) }

// growBlocks makes room in blocks and ends for one more block each. Not
// inlined: see put.
//
//go:noinline
func (h *Hasher) growBlocks() {
	h.blocks, h.ends = slices.Grow(h.blocks, 1), slices.Grow(h.ends, 1)
}

// bytesString views b as a string, for hashing it without a copy.
func bytesString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// Blocks returns the hashes of the complete blocks so far. The trailing
// partial block is not hashed: engines cache only full blocks too, and a
// partial block would never match the full block a longer prompt has in
// its place. The slice is reused by the next Reset; copy it to keep it.
func (h *Hasher) Blocks() []uint64 { return h.blocks }

// Len returns the canonical bytes written so far (complete blocks and the
// trailing partial one).
func (h *Hasher) Len() int { return h.total }

// Seed returns the chain seed derived from model, adapter and salt.
func (h *Hasher) Seed() uint64 { return h.seed }

// TokensIn estimates the prompt tokens covered by the first n blocks, for
// scorers that weigh matches in tokens. n beyond Blocks counts the whole
// prompt so far.
func (h *Hasher) TokensIn(n int) int {
	var b int
	switch {
	case n <= 0:
		return 0
	case n > len(h.ends):
		b = h.total
	default:
		b = h.ends[n-1]
	}
	return b / h.cfg.CharsPerToken
}

// PromptTokens estimates the tokens of the whole prompt fed so far.
func (h *Hasher) PromptTokens() int { return h.total / h.cfg.CharsPerToken }

// littleEndian is true on machines that store a uint32 as its
// little-endian encoding (Wasm, amd64, arm64): Tokens then hashes ids where
// they are.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1
