package cachestate

import (
	"slices"
	"testing"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/metricsvc/kvevents"
)

func ids(base uint64, from, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base<<32 | uint64(from+i)
	}
	return out
}

func keys(hs []uint64) []kvevents.BlockHash {
	out := make([]kvevents.BlockHash, len(hs))
	for i, h := range hs {
		out[i] = kvevents.IntHash(h)
	}
	return out
}

func stored(hs []uint64, parent uint64, bs int) kvevents.Event {
	ev := kvevents.Event{Kind: kvevents.BlockStored, Hashes: keys(hs), BlockSize: bs, Tokens: bs * len(hs)}
	if parent != 0 {
		ev.Parent = kvevents.IntHash(parent)
	}
	return ev
}

func removed(hs ...uint64) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: keys(hs)}
}

func apply(b *Bridge, evs ...kvevents.Event) []Delta {
	return b.Apply(kvevents.Batch{Events: evs}, 0, nil)
}

func wantDeltas(t *testing.T, what string, got []Delta, want ...Delta) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d deltas %+v, want %d %+v", what, len(got), got, len(want), want)
	}
	for i := range got {
		if got[i].Kind != want[i].Kind || got[i].From != want[i].From || !slices.Equal(got[i].Chain, want[i].Chain) {
			t.Errorf("%s: delta %d = %+v, want %+v", what, i, got[i], want[i])
		}
	}
}

// One kvroute block per engine block (64 characters, 16 tokens of 4).
func TestBridgeCorrelatesAndTruncates(t *testing.T) {
	b := &Bridge{Hash: index.HashConfig{BlockChars: 64, LevelBlocks: -1}}
	a := ids(1, 0, 8)                                  // request A's kvroute chain
	bb := append(slices.Clone(a[:4]), ids(2, 4, 4)...) // B shares A's first 4 blocks
	ea, eb := ids(10, 0, 8), ids(11, 4, 4)             // the engine's hashes

	b.Route(a, 0, 0)
	wantDeltas(t, "A stored", apply(b, stored(ea[:3], 0, 16), stored(ea[3:], ea[2], 16)),
		Delta{Stored, a[:3], 0}, Delta{Stored, a, 3})
	// B hits A's first 4 blocks: the engine stores only B's last 4, after
	// A's 4th.
	b.Route(bb, 0, 1)
	wantDeltas(t, "B stored", apply(b, stored(eb, ea[3], 16)), Delta{Stored, bb, 4})
	// The engine evicts A's tail (last block first): A's chain is cut at
	// the first evicted block, in one delta.
	wantDeltas(t, "A's tail evicted", apply(b, removed(ea[7], ea[6], ea[5])), Delta{Removed, a, 5})
	// A block of the shared prefix: every chain through it loses it; the
	// Bridge names the chain that stored it.
	wantDeltas(t, "shared block evicted", apply(b, removed(ea[3], 999)), Delta{Removed, a, 3})
	if st := b.Stats(); st.Matched != 3 || st.Removed != 4 || st.Unmapped != 1 || st.MappedNow != 8 {
		t.Errorf("stats %+v", st)
	}
	// A store no route explains (a request from a gateway whose report
	// was lost) stays unmapped, and so do its removals.
	wantDeltas(t, "unexplained store", apply(b, stored(ids(12, 0, 2), 0, 16)))
	if st := b.Stats(); st.Unmatched != 1 {
		t.Errorf("unmatched = %d, want 1", st.Unmatched)
	}
	wantDeltas(t, "clear", apply(b, kvevents.Event{Kind: kvevents.AllBlocksCleared}), Delta{Kind: Cleared})
	if b.Stats().MappedNow != 0 {
		t.Error("clear kept mappings")
	}
}

// Routes with the same parent are told apart by their chains; the oldest
// of two identical ones takes the first store.
func TestBridgeMatchesByPrefixThenAge(t *testing.T) {
	b := &Bridge{Hash: index.HashConfig{BlockChars: 64, LevelBlocks: -1}}
	sys := ids(1, 0, 2)
	x := append(slices.Clone(sys), ids(2, 2, 2)...)
	y := append(slices.Clone(sys), ids(3, 2, 2)...)
	es := ids(10, 0, 2)
	b.Route(sys, 0, 0)
	apply(b, stored(es, 0, 16))
	b.Route(x, 0, 1)
	b.Route(y, 0, 2)
	// y's blocks arrive first: the parent is shared, so age decides (x);
	// this is the ambiguity docs/cache-state.md bounds.
	d := apply(b, stored(ids(13, 2, 2), es[1], 16))
	wantDeltas(t, "first continuation", d, Delta{Stored, x, 2})
	wantDeltas(t, "second continuation", apply(b, stored(ids(12, 2, 2), es[1], 16)), Delta{Stored, y, 2})
	// A route whose prompt is too short for the blocks is not a candidate.
	b.Route(ids(4, 0, 1), 0, 3)
	wantDeltas(t, "too short", apply(b, stored(ids(14, 0, 3), 0, 16)))
}

// kvroute's blocks are 256 characters (64 tokens) and double after 2; the
// engine's 16 tokens: four engine blocks make one kvroute block.
func TestBridgeDepthConversion(t *testing.T) {
	b := &Bridge{Hash: index.HashConfig{BlockChars: 256, LevelBlocks: 2, MaxLevel: 4}, BlockSize: 16}
	c := ids(1, 0, 4) // 256 + 256 + 512 + 512 characters: 64, 128, 256, 384 tokens
	e := ids(10, 0, 24)
	b.Route(c, 0, 0)
	// llm-d-inference-sim sends no block size: the event's token count or
	// the scraped size gives it.
	ev := stored(e[:6], 0, 0)
	wantDeltas(t, "96 tokens", apply(b, ev), Delta{Stored, c[:1], 0})
	wantDeltas(t, "384 tokens", apply(b, stored(e[6:], e[5], 16)), Delta{Stored, c, 1})
	// Evicting engine block 13 (tokens 192..208) keeps 192 tokens: 2 kvroute blocks.
	wantDeltas(t, "cut at 192 tokens", apply(b, removed(e[12:]...)), Delta{Removed, c, 2})
	// Chars per token calibrated at 2 instead of 4: engine depth d covers
	// half the characters.
	b2 := &Bridge{Hash: index.HashConfig{BlockChars: 256, LevelBlocks: 2, MaxLevel: 4}, CharsPerToken: 2}
	b2.Route(c, 0, 0)
	wantDeltas(t, "calibrated", apply(b2, stored(e[:16], 0, 16)), Delta{Stored, c[:2], 0})
}
