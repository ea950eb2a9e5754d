package sim

import (
	"encoding/binary"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// CharsPerToken is the simulator's tokenizer: one token per 4 bytes of
// prompt text, the usual rule of thumb for English with Llama 3's tokenizer.
// The simulated engines, the trace expansion and the generators all use it,
// so a prompt's token count and its blocks agree everywhere.
const CharsPerToken = 4

// CountTokens is the token count of a prompt text (at least 1).
func CountTokens(text string) int {
	return max(1, (len(text)+CharsPerToken-1)/CharsPerToken)
}

// BlockChain returns the hash chain of text's full blockSize-token blocks:
// h_i = xxhash64(h_{i-1} || block_i). It is the engine's own notion of a
// cacheable block, independent of how the router hashes.
func BlockChain(text string, blockSize int) []uint64 {
	chunk := blockSize * CharsPerToken
	n := len(text) / chunk
	chain := make([]uint64, n)
	var buf [8]byte
	var d xxhash.Digest
	var prev uint64
	for i := range n {
		d.Reset()
		binary.LittleEndian.PutUint64(buf[:], prev)
		d.Write(buf[:])
		d.WriteString(text[i*chunk : (i+1)*chunk])
		prev = d.Sum64()
		chain[i] = prev
	}
	return chain
}

// ChatMessage is one message of a chat request, as the engine renders it.
type ChatMessage struct {
	Role    string
	Content string
}

// RenderChat is the simulated engine's chat template: each message as a
// role header line and its content. Like real templates it is prefix-stable:
// the rendering of turn N is a prefix of the rendering of turn N+1.
func RenderChat(msgs []ChatMessage) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>\n")
		b.WriteString(m.Content)
		b.WriteString("\n")
	}
	b.WriteString("<|assistant|>\n")
	return b.String()
}

// WithAdapter makes chain a LoRA adapter's own, in place: vLLM keys a
// block's hash with the request's adapter as well, so the same prompt run
// with two adapters (or with one and the base model) shares no KV. Mixing
// one value into every hash keeps prefixes shared within the adapter.
func WithAdapter(chain []uint64, adapter string) []uint64 {
	if adapter == "" {
		return chain
	}
	k := xxhash.Sum64String(adapter)
	for i := range chain {
		chain[i] ^= k
	}
	return chain
}
