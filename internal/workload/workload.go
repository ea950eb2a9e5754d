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
	"time"

	"github.com/kvroute/kvroute/internal/sim"
)

// Request is one client request of a workload.
type Request struct {
	ID      int
	Arrival time.Duration
	Model   string
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
