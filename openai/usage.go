package openai

// Reading an engine's response: the usage it reports, for the router's
// feedback. Nothing here keeps state: a stream's Tail lives with that one
// response (in the filter's stream context), and the scans read only the
// chunk and tail they are given.

// cachedTokensKey is the field vLLM and SGLang report prefix-cache hits in
// (usage.prompt_tokens_details.cached_tokens), in non-streaming bodies and in
// the final chunk of a stream with include_usage.
var cachedTokensKey = []byte(`"cached_tokens":`)

const tailKeep = 64

// CachedTokens finds the last complete cached_tokens value in tail+chunk:
// a run of up to 18 digits after the key (and optional spaces) that
// something other than a digit follows (a run that reaches the end may
// continue in the next chunk). It scans bytes instead of parsing JSON: a
// stream's chunks are SSE events, and the field may straddle two chunks. A
// value found in chunk is the last one (a value across the seam starts
// before it), so the seam is looked at only when chunk has none.
func CachedTokens(tail, chunk []byte) (val int, found bool) {
	val, found = lastNumber(chunk, cachedTokensKey)
	if !found && len(tail) > 0 {
		return seamCachedTokens(tail, chunk)
	}
	return val, found
}

// promptTokensKey is usage.prompt_tokens (the quote after the name keeps
// prompt_tokens_details out).
var promptTokensKey = []byte(`"prompt_tokens":`)

// PromptTokens finds the last complete usage.prompt_tokens value in chunk,
// as lastNumber reads it: the engine's count of the prompt's tokens, read
// from the chunk that carries cached_tokens (no seam: the two fields are one
// usage object).
func PromptTokens(chunk []byte) (val int, found bool) {
	return lastNumber(chunk, promptTokensKey)
}

// lastNumber finds the last complete value of key in b: a run of up to 18
// digits after the key (and optional spaces) that something other than a
// digit follows.
func lastNumber(b, key []byte) (val int, found bool) {
	for {
		i := indexBytes(b, key)
		if i < 0 {
			return val, found
		}
		b = b[i+len(key):]
		j := 0
		for j < len(b) && b[j] == ' ' {
			j++
		}
		k, n := j, 0
		for k < len(b) && b[k] >= '0' && b[k] <= '9' && k-j < 18 {
			n = n*10 + int(b[k]-'0')
			k++
		}
		if k > j && k < len(b) && (b[k] < '0' || b[k] > '9') {
			found, val = true, n
		}
	}
}

// seamCachedTokens finds a cached_tokens value across the seam of two chunks:
// in tail joined with the head of chunk. Out of line (noinline): only a stream
// whose usage is split across chunks needs it, and each function entered costs
// a response (docs/performance.md).
//
//go:noinline
func seamCachedTokens(tail, chunk []byte) (int, bool) {
	var buf [2 * tailKeep]byte
	joined := append(buf[:0], tail...)
	joined = append(joined, chunk[:min(len(chunk), tailKeep)]...)
	return CachedTokens(nil, joined)
}

// Tail holds the last tailKeep bytes of a response chunk, for a field split
// across two chunks. Its scope is one response: the filter keeps it in the
// stream context itself (no allocation per stream).
type Tail struct {
	b [tailKeep]byte
	n int
}

// Bytes is the kept end of the previous chunk.
func (t *Tail) Bytes() []byte { return t.b[:t.n] }

// Keep replaces the tail with the end of chunk. Out of line (noinline): only a
// response in several chunks keeps a tail, and each function entered costs a
// response (docs/performance.md).
//
//go:noinline
func (t *Tail) Keep(chunk []byte) {
	if len(chunk) > tailKeep {
		chunk = chunk[len(chunk)-tailKeep:]
	}
	t.n = copy(t.b[:], chunk)
}

// indexBytes is bytes.Index for the short keys the response scan looks for.
// Go's Wasm build has no assembly search, and its portable one (Rabin-Karp
// for longer keys) is two more functions brought into the cache per
// response; this loop over the key's first byte is all a response needs.
func indexBytes(b, sub []byte) int {
	if len(sub) == 0 {
		return 0
	}
	first := sub[0]
	for i := 0; i+len(sub) <= len(b); i++ {
		if b[i] != first {
			continue
		}
		j := 1
		for j < len(sub) && b[i+j] == sub[j] {
			j++
		}
		if j == len(sub) {
			return i
		}
	}
	return -1
}
