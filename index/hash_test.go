package index

import (
	"slices"
	"strings"
	"testing"
)

type msg struct{ role, content string }

func hashChat(h *Hasher, model, adapter, salt string, msgs []msg) []uint64 {
	h.Reset(model, adapter, salt)
	for _, m := range msgs {
		h.Message(m.role, m.content)
	}
	return slices.Clone(h.Blocks())
}

func sharedPrefix(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func longText(seed, n int) string {
	var sb strings.Builder
	words := []string{"cache", "prefix", "token", "envoy", "router", "block", "engine", "decode", "prefill", "gateway"}
	for i := 0; sb.Len() < n; i++ {
		sb.WriteString(words[(i*7+seed*13+i*i)%len(words)])
		sb.WriteByte(' ')
	}
	return sb.String()[:n]
}

func TestHashGrowingConversationSharesLeadingBlocks(t *testing.T) {
	h := NewHasher(HashConfig{BlockChars: 64})
	conv := []msg{{"system", longText(1, 900)}}
	var prev []uint64
	for turn := 0; turn < 6; turn++ {
		conv = append(conv, msg{"user", longText(turn+2, 300+turn*50)})
		cur := hashChat(h, "llama-3-8b", "", "", conv)
		if len(cur) <= len(prev) {
			t.Fatalf("turn %d: %d blocks, not more than the previous %d", turn, len(cur), len(prev))
		}
		if n := sharedPrefix(prev, cur); n != len(prev) {
			t.Fatalf("turn %d shares %d of the previous turn's %d blocks; want all", turn, n, len(prev))
		}
		conv = append(conv, msg{"assistant", longText(turn+40, 200)})
		prev = cur
	}
}

func TestHashSeparatesModelAdapterSaltAndKind(t *testing.T) {
	h := NewHasher(HashConfig{BlockChars: 64})
	conv := []msg{{"system", longText(1, 2000)}, {"user", longText(2, 500)}}
	base := hashChat(h, "m1", "", "", conv)
	if len(base) < 10 {
		t.Fatalf("only %d blocks", len(base))
	}
	for _, v := range []struct{ model, adapter, salt string }{
		{"m2", "", ""}, {"m1", "lora-a", ""}, {"m1", "", "tenant-7"}, {"", "m1", ""},
	} {
		other := hashChat(h, v.model, v.adapter, v.salt, conv)
		for i, x := range other {
			if slices.Contains(base, x) {
				t.Fatalf("%+v: block %d equals a block of the base model", v, i)
			}
		}
	}
	again := hashChat(h, "m1", "", "", conv)
	if !slices.Equal(base, again) {
		t.Fatal("same input, different hashes after Reset")
	}
	// A completions prompt with the same text never meets a chat block.
	h.Reset("m1", "", "")
	h.Text(conv[0].content + conv[1].content)
	for _, x := range h.Blocks() {
		if slices.Contains(base, x) {
			t.Fatal("text prompt shares a block with a chat prompt")
		}
	}
}

func TestHashCanonicalForms(t *testing.T) {
	h := NewHasher(HashConfig{BlockChars: 32, LevelBlocks: -1})
	text := longText(3, 1000)
	// A prompt fed in pieces hashes like the whole.
	h.Reset("m", "", "")
	h.Text(text)
	whole := slices.Clone(h.Blocks())
	h.Reset("m", "", "")
	for i := 0; i < len(text); i += 7 {
		h.Text(text[i:min(i+7, len(text))])
	}
	if !slices.Equal(whole, h.Blocks()) {
		t.Fatal("text in pieces differs from the whole")
	}
	// A longer prompt shares every full block of a shorter one.
	h.Reset("m", "", "")
	h.Text(text + " and some more")
	if n := sharedPrefix(whole, h.Blocks()); n != len(whole) {
		t.Fatalf("grown prompt shares %d of %d blocks", n, len(whole))
	}
	// String content and one text part are the same message.
	h.Reset("m", "", "")
	h.Message("user", text)
	a := slices.Clone(h.Blocks())
	h.Reset("m", "", "")
	h.BeginMessage("user")
	h.Text(text)
	if !slices.Equal(a, h.Blocks()) {
		t.Fatal("BeginMessage+Text differs from Message")
	}
	// Boundaries cannot be imitated by content: moving text between role
	// and content, or between messages, changes the hashes.
	h.Reset("m", "", "")
	h.Message("user", text[:500])
	h.Message("user", text[500:])
	b := slices.Clone(h.Blocks())
	h.Reset("m", "", "")
	h.Message("user", text[:501])
	h.Message("user", text[501:])
	if slices.Equal(b, h.Blocks()) {
		t.Fatal("different message splits hash alike")
	}
	// Tool calls and fields take part.
	h.Reset("m", "", "")
	h.Message("user", text)
	h.BeginMessage("assistant")
	h.ToolCall("call_1", "get_weather", `{"city":"Paris"}`+text)
	c1 := slices.Clone(h.Blocks())
	h.Reset("m", "", "")
	h.Message("user", text)
	h.BeginMessage("assistant")
	h.ToolCall("call_1", "get_weather", `{"city":"Lyon!"}`+text)
	c2 := h.Blocks()
	if sharedPrefix(c1, c2) == len(c1) {
		t.Fatal("tool call arguments do not change the hashes")
	}
	// Token ids: 4 bytes each; 8 tokens per 32-byte block.
	ids := make([]uint32, 100)
	for i := range ids {
		ids[i] = uint32(i * 31)
	}
	h.Reset("m", "", "")
	h.Tokens(ids)
	// 1 kind byte + 400 bytes = 401 bytes: 12 full blocks.
	if got := len(h.Blocks()); got != 12 {
		t.Fatalf("token prompt: %d blocks, want 12", got)
	}
	if got := h.PromptTokens(); got != 100 {
		t.Fatalf("PromptTokens = %d, want 100", got)
	}
}

func TestHashMultiResolution(t *testing.T) {
	h := NewHasher(HashConfig{BlockChars: 100, LevelBlocks: 4, MaxLevel: 2})
	h.Reset("m", "", "")
	h.Text(longText(1, 100000))
	// Level sizes: 4x100, 4x200, then 400 each; the text is 100000 bytes
	// plus the one-byte prompt kind.
	want := []int{100, 200, 300, 400, 600, 800, 1000, 1200, 1600, 2000}
	for i, w := range want {
		if h.ends[i] != w {
			t.Fatalf("block %d ends at %d, want %d (ends %v)", i, h.ends[i], w, h.ends[:10])
		}
	}
	if got, want := len(h.Blocks()), 8+(100001-1200)/400; got != want {
		t.Fatalf("%d blocks, want %d", got, want)
	}
	if got := h.TokensIn(4); got != 100 {
		t.Fatalf("TokensIn(4) = %d, want 100", got)
	}
	if got := h.TokensIn(1 << 20); got != 25000 {
		t.Fatalf("TokensIn(all) = %d, want 25000", got)
	}
}

// TestHashGolden pins the hash function: changing it silently would make
// every gateway of a rolling upgrade disagree with the others. Update the
// values only together with a release note (docs/operations.md, "Rolling
// out a new filter version").
func TestHashGolden(t *testing.T) {
	h := NewHasher(HashConfig{})
	h.Reset("llama-3-8b", "", "")
	h.Message("system", strings.Repeat("You are a helpful assistant. ", 20))
	h.Message("user", "What is the capital of France?")
	got := h.Blocks()
	want := []uint64{0xf729b8e623617553, 0xe4ae53ed037b9bfb}
	if !slices.Equal(got, want) {
		t.Fatalf("blocks = %#x, want %#x", got, want)
	}
}

func TestHasherAllocatesNothingWhenWarm(t *testing.T) {
	h := NewHasher(HashConfig{})
	text := longText(5, 200000)
	run := func() {
		h.Reset("m", "", "")
		h.Message("system", text[:5000])
		h.Message("user", text[5000:])
		_ = h.Blocks()
	}
	run()
	if n := testing.AllocsPerRun(10, run); n != 0 {
		t.Fatalf("%v allocations per prompt, want 0", n)
	}
}

// BlocksIn inverts the block sizes: blocks double every LevelBlocks, and a
// partial block does not count.
func TestBlocksIn(t *testing.T) {
	c := HashConfig{BlockChars: 10, LevelBlocks: 2, MaxLevel: 2}
	// sizes 10 10 20 20 40 40 40 ...; ends 10 20 40 60 100 140 180
	for _, tc := range []struct{ chars, want int }{
		{0, 0}, {9, 0}, {10, 1}, {39, 2}, {40, 3}, {60, 4}, {99, 4}, {100, 5}, {180, 7}, {-5, 0},
	} {
		if got := c.BlocksIn(tc.chars); got != tc.want {
			t.Errorf("BlocksIn(%d) = %d, want %d", tc.chars, got, tc.want)
		}
	}
	if got := (HashConfig{BlockChars: 8, LevelBlocks: -1}).BlocksIn(100); got != 12 {
		t.Errorf("fixed blocks: BlocksIn(100) = %d, want 12", got)
	}
}

// Message is BeginMessage and Text, whatever the lengths of the role and
// the content (one-byte and longer lengths) and wherever in a block the
// message falls; likewise Tokens is Token per id.
func TestMessageAndTokensMatchTheirPieces(t *testing.T) {
	a, b := NewHasher(HashConfig{BlockChars: 64, LevelBlocks: 2}), NewHasher(HashConfig{BlockChars: 64, LevelBlocks: 2})
	text := longText(3, 600)
	for _, lead := range []int{0, 1, 30, 55, 60, 63, 64, 200} {
		for _, rl := range []int{0, 1, 4, 127, 128, 129} {
			for _, cl := range []int{0, 2, 50, 57, 58, 127, 128, 300} {
				a.Reset("m", "", "")
				b.Reset("m", "", "")
				a.Message("system", text[:lead])
				b.BeginMessage("system")
				b.Text(text[:lead])
				for k := 0; k < 3; k++ {
					a.Message(text[k:k+rl], text[100+k:100+k+cl])
					b.BeginMessage(text[k : k+rl])
					b.Text(text[100+k : 100+k+cl])
				}
				if !slices.Equal(a.Blocks(), b.Blocks()) || a.Len() != b.Len() {
					t.Fatalf("lead %d, role %d, content %d bytes: Message hashed %d bytes (%d blocks), BeginMessage+Text %d (%d)",
						lead, rl, cl, a.Len(), len(a.Blocks()), b.Len(), len(b.Blocks()))
				}
			}
		}
	}
	ids := make([]uint32, 700)
	for i := range ids {
		ids[i] = uint32(i * 7919)
	}
	a.Reset("m", "", "")
	b.Reset("m", "", "")
	a.Tokens(ids[:1])
	a.Tokens(ids[1:300])
	a.Tokens(ids[300:])
	for _, id := range ids {
		b.Token(id)
	}
	if !slices.Equal(a.Blocks(), b.Blocks()) || a.Len() != b.Len() || len(a.Blocks()) < 5 {
		t.Fatalf("Tokens hashed %d bytes (%d blocks), Token per id %d (%d)", a.Len(), len(a.Blocks()), b.Len(), len(b.Blocks()))
	}
	if n := testing.AllocsPerRun(10, func() { a.Tokens(ids[:2]) }); n != 0 {
		t.Fatalf("Tokens allocates %v times per call, want 0", n)
	}
}
