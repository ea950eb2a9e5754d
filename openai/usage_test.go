package openai

import (
	"bytes"
	"math/rand"
	"strings"
	"testing"
)

// cachedTokensJoined is the answer the seam logic must give: a whole-buffer
// scan (CachedTokens without a tail) of tail joined with chunk's head, then
// of chunk, the last value found winning. CachedTokens looks at the seam
// only when chunk has no value, which must not change any answer.
func cachedTokensJoined(tail, chunk []byte) (val int, found bool) {
	if len(tail) > 0 {
		joined := append(append([]byte(nil), tail...), chunk[:min(len(chunk), tailKeep)]...)
		val, found = CachedTokens(nil, joined)
	}
	if v, ok := CachedTokens(nil, chunk); ok {
		val, found = v, true
	}
	return val, found
}

// TestCachedTokensMatchesJoinedScan splits response bodies with zero, one
// or several cached_tokens fields (some cut short, some padded with
// spaces) into chunks at random places, and checks that every chunk's
// answer, with the previous chunk's tail, is the joined scan's.
func TestCachedTokensMatchesJoinedScan(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	pieces := []string{
		`data: {"choices":[{"text":"hi"}]}` + "\n\n",
		`"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":48}}`,
		`"cached_tokens": 1024}`,
		`"cached_tokens":`,
		`"cached_tokens":7`,
		`"cached_tokens":  123456789012345678901,`,
		`"cached_":12}`,
		strings.Repeat("x", 70),
		"data: [DONE]\n\n",
		"9",
		" ",
	}
	for round := 0; round < 20000; round++ {
		var b strings.Builder
		for n := rng.Intn(6); n >= 0; n-- {
			b.WriteString(pieces[rng.Intn(len(pieces))])
		}
		body := []byte(b.String())
		checkChunks(t, body, func(rest, _ int) int {
			if rng.Intn(2) == 0 {
				return 1 + rng.Intn(20)
			}
			return 1 + rng.Intn(rest)
		})
	}
}

// checkChunks cuts body into chunks, each of cut(bytes left, chunk number)
// bytes (at least 1, at most what is left), and checks each chunk's answer,
// with the previous chunk's tail, against the joined scan.
func checkChunks(t *testing.T, body []byte, cut func(rest, i int) int) {
	t.Helper()
	var tail Tail
	for i := 0; len(body) > 0; i++ {
		n := min(max(cut(len(body), i), 1), len(body))
		chunk := body[:n]
		body = body[n:]
		gotN, gotOK := CachedTokens(tail.Bytes(), chunk)
		wantN, wantOK := cachedTokensJoined(tail.Bytes(), chunk)
		if gotOK != wantOK || gotOK && gotN != wantN {
			t.Fatalf("CachedTokens(%q, %q) = %d, %v; joined scan: %d, %v", tail.Bytes(), chunk, gotN, gotOK, wantN, wantOK)
		}
		tail.Keep(chunk)
		if len(tail.Bytes()) > tailKeep {
			t.Fatalf("the tail keeps %d bytes, more than %d", len(tail.Bytes()), tailKeep)
		}
	}
}

func TestCachedTokensAcrossChunks(t *testing.T) {
	if n, ok := CachedTokens(nil, []byte(`{"usage":{"prompt_tokens_details":{"cached_tokens": 96}}}`)); !ok || n != 96 {
		t.Errorf("whole: %d %v", n, ok)
	}
	first := []byte(`data: {"usage":{"prompt_tokens_details":{"cached_tok`)
	second := []byte(`ens":128}}}` + "\n\n")
	if _, ok := CachedTokens(nil, first); ok {
		t.Error("found a value in half a field")
	}
	var tail Tail
	tail.Keep(first)
	if n, ok := CachedTokens(tail.Bytes(), second); !ok || n != 128 {
		t.Errorf("split: %d %v", n, ok)
	}
	// A long chunk leaves only its end; a split field is still found.
	long := append(bytes.Repeat([]byte("x"), 3*tailKeep), first...)
	tail.Keep(long)
	if got := string(tail.Bytes()); got != string(long[len(long)-tailKeep:]) {
		t.Errorf("tail kept %q, want the chunk's last %d bytes", got, tailKeep)
	}
	if n, ok := CachedTokens(tail.Bytes(), second); !ok || n != 128 {
		t.Errorf("split after a long chunk: %d %v", n, ok)
	}
	// A number cut at the chunk end is not taken until it is complete.
	if _, ok := CachedTokens(nil, []byte(`"cached_tokens":12`)); ok {
		t.Error("took a number that may continue in the next chunk")
	}
}

func TestIndexBytes(t *testing.T) {
	key := []byte(`"cached_tokens":`)
	for _, c := range []struct {
		b    string
		want int
	}{
		{`{"cached_tokens":5}`, 1},
		{`"cached_tokens"`, -1},
		{`""cached_tokens":`, 1},
		{`xx"cached_token":"cached_tokens":`, 17},
		{``, -1},
	} {
		if got := indexBytes([]byte(c.b), key); got != c.want {
			t.Errorf("indexBytes(%q) = %d, want %d", c.b, got, c.want)
		}
	}
}

// FuzzCachedTokensAcrossChunks cuts a body into chunks at the places the
// fuzzer picks and checks each chunk's answer, with the previous chunk's
// tail, against the joined scan.
func FuzzCachedTokensAcrossChunks(f *testing.F) {
	f.Add([]byte(`data: {"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":48}}}`+"\n\n"), []byte{30, 7, 1})
	f.Add([]byte(`"cached_tokens": 1024}"cached_tokens":7`), []byte{17, 1, 2, 3})
	f.Add(bytes.Repeat([]byte(`"cached_tokens":9`), 9), []byte{70, 70})
	f.Fuzz(func(t *testing.T, body, cuts []byte) {
		checkChunks(t, body, func(rest, i int) int {
			if i < len(cuts) {
				return 1 + int(cuts[i])
			}
			return rest
		})
	})
}

// PromptTokens reads usage.prompt_tokens, not a field whose name begins
// with it, and only a number the chunk holds whole.
func TestPromptTokens(t *testing.T) {
	for body, want := range map[string]int{
		`{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":4}}}`:  12,
		`{"usage":{"prompt_tokens_details":{"cached_tokens":4},"prompt_tokens": 30}}`: 30,
		`{"usage":{"prompt_tokens_details":{"cached_tokens":4}}}`:                     -1,
		`{"usage":{"prompt_tokens":12`:                                                -1,
	} {
		n, ok := PromptTokens([]byte(body))
		if !ok {
			n = -1
		}
		if n != want {
			t.Errorf("PromptTokens(%s) = %d, want %d", body, n, want)
		}
	}
}
