// Package workload produces the request streams kvroute is measured on:
// replay of Mooncake traces and generators for the shapes that make prefix
// caching matter (shared system prompts, multi-turn chat, RAG).
//
// A Request carries what a client would send (a completion prompt or chat
// messages, a model, a session) plus its arrival time and the number of
// output tokens the engine should generate. Prompt text is pseudo-text built
// deterministically from seeds, so the router hashes real bytes exactly as it
// would in production, and two requests that share a prefix share its bytes.
// Nothing here is real user text.
package workload

import (
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/sim"
)

// Request is one client request of a workload.
type Request struct {
	ID      int
	Arrival time.Duration
	Model   string
	// Adapter is the LoRA adapter the request names ("" for the base
	// model); a client sends it as the model, which the gateway maps to
	// Model (loraAdapters).
	Adapter string
	// Session identifies a conversation (multi-turn chat, a trace's user);
	// routers that pin sessions read it as a header.
	Session string
	// Exactly one of Prompt, Messages or HashIDs describes the prompt.
	Prompt   string
	Messages []sim.ChatMessage
	// HashIDs are a Mooncake trace's prompt blocks; the text is expanded on
	// demand by Text, keeping a whole trace small in memory.
	HashIDs      []int64
	PromptTokens int
	OutputTokens int
}

// Chat reports whether the request goes to /v1/chat/completions.
func (r *Request) Chat() bool { return r.Messages != nil }

// Text is the prompt as the engine sees it: the completion prompt, the
// expanded trace blocks, or the chat messages rendered with the simulated
// engine's template.
func (r *Request) Text() string {
	switch {
	case r.Messages != nil:
		return sim.RenderChat(r.Messages)
	case r.HashIDs != nil:
		return ExpandHashIDs(r.HashIDs, r.PromptTokens)
	default:
		return r.Prompt
	}
}

// Workload is an ordered request stream (by Arrival).
type Workload struct {
	Name     string
	Requests []Request
}

// InputTokens is the total prompt tokens of the workload.
func (w *Workload) InputTokens() int64 {
	var n int64
	for i := range w.Requests {
		n += int64(w.Requests[i].PromptTokens)
	}
	return n
}

// AssignAdapters makes every request name one of n LoRA adapters,
// "lora-0" to "lora-<n-1>", for a multi-adapter fleet. A conversation
// keeps one adapter (the choice hashes the session, or the request's ID
// when it has none) and popularity is skewed as tenants' traffic is: the
// adapter is the smaller of two uniform draws, so lora-0 gets about 2/n
// of the requests and lora-<n-1> about 1/n². n <= 0 removes adapters.
func (w *Workload) AssignAdapters(n int, seed uint64) {
	for i := range w.Requests {
		r := &w.Requests[i]
		r.Adapter = ""
		if n <= 0 {
			continue
		}
		key := r.Session
		if key == "" {
			key = strconv.Itoa(r.ID)
		}
		h := xxhash.Sum64String(strconv.FormatUint(seed, 10) + "/" + key)
		a, b := h%uint64(n), (h>>32)%uint64(n)
		r.Adapter = "lora-" + strconv.FormatUint(min(a, b), 10)
	}
}
