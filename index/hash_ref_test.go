package index

import (
	"encoding/binary"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// A block's hash is xxhash of the previous hash (the seed for the first
// block) and the block's own xxhash, 8 bytes each, little endian: checked
// for every block length around xxhash's 8-, 32- and 64-byte steps, with
// two blocks of equal bytes, which must not hash alike (the chain depends
// on what came before).
func TestBlockLinkIsTheDefinition(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	buf := make([]byte, 300)
	rng.Read(buf)
	link := func(prev uint64, block []byte) uint64 {
		var pair []byte
		pair = binary.LittleEndian.AppendUint64(pair, prev)
		pair = binary.LittleEndian.AppendUint64(pair, xxhash.Sum64(block))
		return xxhash.Sum64(pair)
	}
	for size := 1; size <= len(buf); size++ {
		h := NewHasher(HashConfig{BlockChars: size, LevelBlocks: -1})
		h.Reset("m", "", "")
		// The canonical bytes: the kind byte 't' and the text, which
		// makes them two equal blocks of size bytes.
		block := append([]byte{kindText}, buf[:size-1]...)
		h.Text(string(block[1:]) + string(block))
		b0 := link(h.Seed(), block)
		if got, want := h.Blocks(), []uint64{b0, link(b0, block)}; !slices.Equal(got, want) {
			t.Fatalf("%d-byte blocks: %#x, want %#x", size, got, want)
		}
		if h.Blocks()[0] == h.Blocks()[1] {
			t.Fatalf("%d-byte blocks: equal blocks hash alike: the link ignores the previous hash", size)
		}
	}
}

// refHasher is the Hasher's definition written out plainly: the canonical
// bytes of the whole prompt in one buffer, cut into blocks by HashConfig
// and each block linked to the previous block's hash (see
// TestBlockLinkIsTheDefinition), written out with plain xxhash calls. The Hasher must agree with it for any sequence of calls
// and any configuration, whichever of its paths (the digest, or whole
// blocks hashed straight from a string) each byte takes.
type refHasher struct {
	cfg   HashConfig
	kind  byte
	canon []byte
	seed  uint64
}

func (r *refHasher) reset(model, adapter, salt string) {
	var b []byte
	for _, s := range []string{model, adapter, salt} {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	r.seed = xxhash.Sum64(b)
	r.kind, r.canon = 0, r.canon[:0]
}

func (r *refHasher) setKind(k byte) {
	if r.kind == 0 {
		r.kind = k
		r.canon = append(r.canon, k)
	}
}

func (r *refHasher) element(tag byte, s string) {
	r.setKind(kindChat)
	r.canon = append(r.canon, tag)
	r.canon = binary.AppendUvarint(r.canon, uint64(len(s)))
	r.canon = append(r.canon, s...)
}

func (r *refHasher) text(s string) {
	if r.kind == kindChat {
		r.element(tagText, s)
		return
	}
	r.setKind(kindText)
	r.canon = append(r.canon, s...)
}

func (r *refHasher) token(id uint32) {
	r.setKind(kindTokens)
	r.canon = binary.LittleEndian.AppendUint32(r.canon, id)
}

func (r *refHasher) blocks() (hashes []uint64, ends []int) {
	cfg := r.cfg.withDefaults()
	prev, off := r.seed, 0
	for i := 0; ; i++ {
		size := cfg.blockSize(i)
		if off+size > len(r.canon) {
			return hashes, ends
		}
		var pair []byte
		pair = binary.LittleEndian.AppendUint64(pair, prev)
		pair = binary.LittleEndian.AppendUint64(pair, xxhash.Sum64(r.canon[off:off+size]))
		prev = xxhash.Sum64(pair)
		off += size
		hashes = append(hashes, prev)
		ends = append(ends, off)
	}
}

func TestHasherMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	alphabet := "abcdefghij klmnopqrstuvwxyz.,\n\"\\é中🙂"
	randText := func() string {
		var n int
		switch rng.Intn(4) {
		case 0:
			n = rng.Intn(8)
		case 1:
			n = rng.Intn(300)
		case 2:
			n = rng.Intn(5000)
		default:
			n = rng.Intn(70000)
		}
		var sb strings.Builder
		for sb.Len() < n {
			sb.WriteByte(alphabet[rng.Intn(len(alphabet))])
		}
		return sb.String()
	}
	configs := []HashConfig{
		{},
		{BlockChars: 8, LevelBlocks: 3, MaxLevel: 2},
		{BlockChars: 33, LevelBlocks: -1},
		{BlockChars: 100, LevelBlocks: 4, MaxLevel: 2},
		{BlockChars: 1},
		{BlockChars: 5, LevelBlocks: 1, MaxLevel: 15},
		{BlockChars: 64, LevelBlocks: 2, MaxLevel: 3},
	}
	for _, cfg := range configs {
		h := NewHasher(cfg)
		ref := &refHasher{cfg: cfg}
		for trial := 0; trial < 40; trial++ {
			model := []string{"llama-3-8b", "", "m"}[trial%3]
			salt := []string{"", "tenant"}[trial%2]
			h.Reset(model, "", salt)
			ref.reset(model, "", salt)
			calls := 1 + rng.Intn(6)
			for c := 0; c < calls; c++ {
				switch op := rng.Intn(8); {
				case op == 0 && (ref.kind == 0 || ref.kind == kindText):
					// Raw text, possibly in pieces.
					s := randText()
					for len(s) > 0 {
						k := 1 + rng.Intn(len(s))
						h.Text(s[:k])
						ref.text(s[:k])
						s = s[k:]
					}
				case op == 1 && (ref.kind == 0 || ref.kind == kindTokens):
					for n := rng.Intn(3000); n > 0; n-- {
						id := rng.Uint32()
						h.Token(id)
						ref.token(id)
					}
				case ref.kind == 0 || ref.kind == kindChat:
					a, b := randText(), randText()
					if rng.Intn(3) == 0 {
						a = "user"
					}
					switch rng.Intn(5) {
					case 0:
						h.Message(a, b)
						ref.element(tagMessage, a)
						ref.text(b)
					case 1:
						h.BeginMessage(a)
						h.Text(b)
						h.Text(a)
						ref.element(tagMessage, a)
						ref.text(b)
						ref.text(a)
					case 2:
						h.Part(a, b)
						ref.element(tagPart, a)
						ref.element(tagPart, b)
					case 3:
						h.ToolCall(a, "fn", b)
						ref.element(tagToolCall, a)
						ref.element(tagToolCall, "fn")
						ref.element(tagToolCall, b)
					default:
						h.Field(a, b)
						ref.element(tagField, a)
						ref.element(tagField, b)
					}
				}
			}
			wantBlocks, wantEnds := ref.blocks()
			if !slices.Equal(h.Blocks(), wantBlocks) {
				t.Fatalf("config %+v, trial %d: %d blocks differ from the reference's %d (first difference at %d)",
					cfg, trial, len(h.Blocks()), len(wantBlocks), sharedPrefix(h.Blocks(), wantBlocks))
			}
			if !slices.Equal(h.ends, wantEnds) || h.Len() != len(ref.canon) || h.Seed() != ref.seed {
				t.Fatalf("config %+v, trial %d: ends, length or seed differ from the reference", cfg, trial)
			}
		}
	}
}

// Bodies of many tiny messages, parts and fields take the Hasher's in-place
// path for a pair of short elements (pair): thousands of them in a row,
// with lengths around the one-byte varint's limit (127, 128) and blocks
// completing inside a pair, must hash as the reference does.
func TestHasherMatchesReferenceForTinyElements(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	word := func() string {
		n := rng.Intn(12)
		if rng.Intn(20) == 0 {
			n = 126 + rng.Intn(4)
		}
		return strings.Repeat(string(rune('a'+rng.Intn(26))), n)
	}
	for _, cfg := range []HashConfig{{}, {BlockChars: 16, LevelBlocks: 2, MaxLevel: 3}, {BlockChars: 7, LevelBlocks: -1}, {BlockChars: 300, LevelBlocks: 1}} {
		h := NewHasher(cfg)
		ref := &refHasher{cfg: cfg}
		for trial := 0; trial < 20; trial++ {
			h.Reset("m", "", "")
			ref.reset("m", "", "")
			for n := rng.Intn(3000); n > 0; n-- {
				a, b := word(), word()
				switch rng.Intn(5) {
				case 0, 1:
					h.Message(a, b)
					ref.element(tagMessage, a)
					ref.text(b)
				case 2:
					h.Part(a, b)
					ref.element(tagPart, a)
					ref.element(tagPart, b)
				case 3:
					h.Field(a, b)
					ref.element(tagField, a)
					ref.element(tagField, b)
				default:
					c := word()
					h.ToolCall(a, b, c)
					ref.element(tagToolCall, a)
					ref.element(tagToolCall, b)
					ref.element(tagToolCall, c)
				}
			}
			wantBlocks, wantEnds := ref.blocks()
			if !slices.Equal(h.Blocks(), wantBlocks) || !slices.Equal(h.ends, wantEnds) || h.Len() != len(ref.canon) {
				t.Fatalf("config %+v, trial %d: %d blocks (%d bytes), reference %d (%d bytes), first difference at %d",
					cfg, trial, len(h.Blocks()), h.Len(), len(wantBlocks), len(ref.canon), sharedPrefix(h.Blocks(), wantBlocks))
			}
		}
	}
}
