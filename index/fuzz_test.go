package index

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"
)

// FuzzSharedValues writes arbitrary bytes into one of the index's keys and
// runs every operation over it: nothing may panic, invalid values read as
// empty and are counted, and the index keeps working afterwards.
func FuzzSharedValues(f *testing.F) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	seedIx := newTestIndex(f, st, clk, Config{Shards: 4})
	a, _ := seedIx.Register("a:1")
	seedIx.SetCapacity(a, 640)
	seedIx.Record(a, chain(1, 20), nil)
	tk, _ := seedIx.AddLoad(a, 10, 10)
	_ = tk
	for _, k := range []string{seedIx.slotsKey, seedIx.shardKeys[0], seedIx.shardKeys[1], seedIx.usageKeys[0], seedIx.loadKey, seedIx.stampKey, seedIx.sharedHintKey(chain(1, 20)[0])} {
		v, _, err := st.Get(k)
		if err == nil {
			f.Add(byte(0), v)
			f.Add(byte(1), v)
			f.Add(byte(3), v)
			f.Add(byte(4), v)
			f.Add(byte(2), v[:len(v)/2])
		}
	}
	f.Add(byte(1), []byte{'K', 'B', 1, 9, 0, 0, 0, 0, 1, 0, 0, 0})
	f.Add(byte(0), []byte{'K', 'S', 1, 0, 0, 0, 0, 0, 255, 255, 0, 0})
	f.Fuzz(func(t *testing.T, which byte, data []byte) {
		st := &MemStore{}
		clk := &fakeClock{ms: 1e6}
		ix := newTestIndex(t, st, clk, Config{Shards: 4})
		a, err := ix.Register("a:1")
		if err != nil {
			t.Fatal(err)
		}
		c := chain(1, 20)
		ix.Record(a, c[:5], nil)
		keys := []string{ix.slotsKey, ix.shardKeys[0], ix.shardKeys[1], ix.usageKeys[0], ix.loadKey, ix.stampKey, ix.sharedHintKey(c[0])}
		key := keys[int(which)%len(keys)]
		st.Set(key, data, 0)
		var m Matches
		ix.Query(c, &m)
		if _, ok := parseShard(data); !ok && key == ix.shardKeys[0] && ix.Metrics().Corrupt == 0 {
			// Only a probed shard is checked; shard 0 may not be probed.
			_ = ok
		}
		// Whatever the value, the index recovers: a host registered and
		// recorded now is found.
		b, err := ix.Register("b:1")
		if err != nil {
			t.Fatalf("Register after a bad value: %v", err)
		}
		ix.SetCapacity(b, 1<<20)
		if err := ix.Record(b, c, nil); err != nil {
			t.Fatalf("Record after a bad value: %v", err)
		}
		ix.Query(c, &m)
		if m.Blocks[b.Slot] != len(c) {
			t.Fatalf("after recovery b matches %d of %d", m.Blocks[b.Slot], len(c))
		}
		tk, err := ix.AddLoad(b, 5, 5)
		if err != nil {
			t.Fatalf("AddLoad after a bad value: %v", err)
		}
		if l := ix.Loads(nil); l[b.Slot].InFlight == 0 {
			t.Fatalf("load not counted: %+v", l)
		}
		if err := ix.Release(&tk); err != nil {
			t.Fatal(err)
		}
		if l := ix.Loads(nil); l[b.Slot] != (Load{}) {
			t.Fatalf("load not released: %+v", l[b.Slot])
		}
	})
}

// FuzzShardCodec checks that a shard value that parses re-encodes to an
// equivalent value.
func FuzzShardCodec(f *testing.F) {
	ent := []entry{{tag: 1, age: 2, bits: [maxWords]uint64{5}}, {tag: 0x70000003, age: 9, bits: [maxWords]uint64{1, 2}}}
	f.Add(encodeShard(nil, ent, 2, 7))
	f.Add(encodeShard(nil, nil, 0, 0))
	f.Add([]byte("KB\x01\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, ok := parseShard(data)
		if !ok {
			return
		}
		var es []entry
		sorted := true
		for i := 0; i < v.n; i++ {
			es = append(es, entry{tag: le.Uint32(v.buf[shardHeader+i*v.stride:]), age: v.age(i), bits: v.bitmap(i)})
			if i > 0 && es[i].tag < es[i-1].tag {
				sorted = false
			}
		}
		// Writers keep entries sorted by tag; an unsorted value (written
		// by something else) may be misread but never panics.
		all := [maxWords]uint64{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}
		some := [maxWords]uint64{0x5555555555555555, 0, ^uint64(0), 1}
		for i := range es {
			p, age, found := v.holders(es[i].tag, &all)
			q, _, _ := v.holders(es[i].tag, &some)
			if !sorted {
				continue
			}
			// A repeated tag (not strictly sorted, but in order) answers
			// with its first entry.
			first := es[i]
			for j := i; j > 0 && es[j-1].tag == first.tag; j-- {
				first = es[j-1]
			}
			if !found || p != first.bits || age != first.age {
				t.Fatalf("holders(%#x) = %x, %d, %v in a sorted shard; want %x, %d", first.tag, p, age, found, first.bits, first.age)
			}
			if q != and(first.bits, some) {
				t.Fatalf("holders(%#x) masked = %x, want %x", first.tag, q, and(first.bits, some))
			}
		}
		w := v.words
		out := encodeShard(nil, es, w, v.epoch)
		if v.n > 0 && !bytes.Equal(out[12:], data[12:]) {
			t.Fatalf("entries re-encode differently")
		}
		if _, ok := parseShard(out); !ok {
			t.Fatal("re-encoded shard does not parse")
		}
	})
}

// FuzzSlotCodec checks the slot table decoder on arbitrary bytes.
func FuzzSlotCodec(f *testing.F) {
	var tb slotTable
	tb.n = 3
	tb.epoch = 4
	tb.recs[0] = slotRec{addrHash: 9, gen: 1, clearEpoch: 2, capacity: 100, horizon: 5}
	tb.recs[2] = slotRec{gen: 3, clearEpoch: 4}
	f.Add(encodeSlots(nil, &tb))
	f.Add([]byte("KS\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var a, b slotTable
		if !decodeSlots(data, &a) {
			if a.n != 0 || !isZero(a.active) {
				t.Fatal("a failed decode left a non-empty table")
			}
			return
		}
		if !decodeSlots(encodeSlots(nil, &a), &b) || a != b {
			t.Fatal("slot table does not round-trip")
		}
	})
}

// FuzzHasherPrefixStable interprets data as a program of hasher calls and
// checks the properties routing depends on: hashing the first k calls
// yields a prefix of the blocks of all calls (a conversation that grows
// keeps its leading blocks), and feeding text in other chunks changes
// nothing.
func FuzzHasherPrefixStable(f *testing.F) {
	f.Add([]byte("\x00user\x00hello world, this is a prompt\x01assistant\x00fine"), uint8(3), uint8(1))
	f.Add([]byte("\x03plain completion prompt that keeps going and going"), uint8(1), uint8(0))
	f.Add([]byte("\x04\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c"), uint8(5), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, chunk, cut uint8) {
		type call struct {
			op  byte
			arg string
		}
		var prog []call
		for len(data) > 0 {
			op := data[0] % 6
			data = data[1:]
			end := bytes.IndexByte(data, 0)
			if end < 0 {
				end = len(data)
			}
			prog = append(prog, call{op, string(data[:end])})
			data = data[min(end+1, len(data)):]
		}
		cfg := HashConfig{BlockChars: 8, LevelBlocks: 3, MaxLevel: 2}
		h := NewHasher(cfg)
		run := func(prog []call, chunk int) []uint64 {
			h.Reset("m", "", "")
			for _, c := range prog {
				switch c.op {
				case 0, 1:
					h.Message("r"+string(rune('0'+c.op)), c.arg)
				case 2:
					h.ToolCall("id", c.arg, c.arg)
				case 3:
					if h.kind == kindChat {
						h.Text(c.arg)
						continue
					}
					for i := 0; i < len(c.arg); i += chunk {
						h.Text(c.arg[i:min(i+chunk, len(c.arg))])
					}
				case 4:
					for i := 0; i+4 <= len(c.arg); i += 4 {
						h.Token(binary.LittleEndian.Uint32([]byte(c.arg[i:])))
					}
				case 5:
					h.Field("name", c.arg)
				}
			}
			return slices.Clone(h.Blocks())
		}
		whole := run(prog, 1<<30)
		n := int(chunk%16) + 1
		// Raw text (a completions prompt, the first call) may arrive in
		// any chunks; in a chat each Text is one content part.
		if again := run(prog, n); len(prog) > 0 && prog[0].op == 3 && !slices.Equal(whole, again) {
			t.Fatalf("chunking text by %d changed the blocks", n)
		}
		k := 0
		if len(prog) > 0 {
			k = int(cut) % (len(prog) + 1)
		}
		prefix := run(prog[:k], 1<<30)
		if m := sharedPrefix(prefix, whole); m != len(prefix) {
			t.Fatalf("the first %d of %d calls share %d of their %d blocks", k, len(prog), m, len(prefix))
		}
	})
}
