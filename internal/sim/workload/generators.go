package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
)

// arrivals draws Poisson arrival times at rate requests per second.
func arrivals(rng *rand.Rand, n int, rate float64) []time.Duration {
	out := make([]time.Duration, n)
	var t float64
	for i := range out {
		if rate > 0 {
			t += rng.ExpFloat64() / rate
		}
		out[i] = time.Duration(t * float64(time.Second))
	}
	return out
}

func seedOf(seed uint64, kind, a, b int) uint64 {
	s := splitmix64(seed ^ uint64(kind)<<56 ^ uint64(a)<<28 ^ uint64(b))
	return s.next()
}

// SharedPrefix is the shared-system-prompt benchmark of SGLang's
// generated-shared-prefix dataset and llm-d's benchmarks: Groups system
// prompts, each followed by PromptsPerGroup different questions.
type SharedPrefix struct {
	Groups          int
	PromptsPerGroup int
	SystemTokens    int
	QuestionTokens  int
	OutputTokens    int
	Rate            float64 // requests per second (Poisson); 0 sends all at once
	Seed            uint64
	Model           string
}

// Generate builds the workload; requests of all groups are interleaved at
// random, as independent users would send them.
func (g SharedPrefix) Generate() (*Workload, error) {
	if g.Groups < 1 || g.PromptsPerGroup < 1 || g.SystemTokens < 0 || g.QuestionTokens < 1 || g.OutputTokens < 1 {
		return nil, fmt.Errorf("shared-prefix workload needs groups, prompts per group, question and output tokens >= 1 (got %+v)", g)
	}
	rng := rand.New(rand.NewPCG(g.Seed, 1))
	w := &Workload{Name: fmt.Sprintf("shared-prefix %dx%d", g.Groups, g.PromptsPerGroup)}
	for gi := range g.Groups {
		system := PseudoTokens(seedOf(g.Seed, 1, gi, 0), g.SystemTokens)
		for p := range g.PromptsPerGroup {
			q := PseudoTokens(seedOf(g.Seed, 2, gi, p), g.QuestionTokens)
			text := system + q
			w.Requests = append(w.Requests, Request{
				Model:        modelOr(g.Model),
				Session:      fmt.Sprintf("group-%d-user-%d", gi, p),
				Prompt:       text,
				PromptTokens: sim.CountTokens(text),
				OutputTokens: g.OutputTokens,
			})
		}
	}
	rng.Shuffle(len(w.Requests), func(i, j int) { w.Requests[i], w.Requests[j] = w.Requests[j], w.Requests[i] })
	stamp(w, arrivals(rng, len(w.Requests), g.Rate))
	return w, nil
}

// MultiTurn is multi-turn chat: Users conversations of Rounds turns each.
// Every turn resends the whole history (system prompt, earlier questions and
// answers) plus a new question, so turn N+1 extends turn N's prompt.
type MultiTurn struct {
	Users          int
	Rounds         int
	SystemTokens   int
	QuestionTokens int
	OutputTokens   int
	// Rate is the rate of new conversations per second; ThinkTime is the
	// pause between an answer and the user's next question (virtual time:
	// a turn is issued ThinkTime after the previous one's arrival).
	Rate      float64
	ThinkTime time.Duration
	Seed      uint64
	Model     string
}

// Generate builds the workload.
func (g MultiTurn) Generate() (*Workload, error) {
	if g.Users < 1 || g.Rounds < 1 || g.QuestionTokens < 1 || g.OutputTokens < 1 || g.SystemTokens < 0 {
		return nil, fmt.Errorf("multi-turn workload needs users, rounds, question and output tokens >= 1 (got %+v)", g)
	}
	rng := rand.New(rand.NewPCG(g.Seed, 2))
	starts := arrivals(rng, g.Users, g.Rate)
	w := &Workload{Name: fmt.Sprintf("multi-turn %dx%d", g.Users, g.Rounds)}
	for u := range g.Users {
		history := []sim.ChatMessage{{Role: "system", Content: PseudoTokens(seedOf(g.Seed, 3, u, 0), g.SystemTokens)}}
		t := starts[u]
		for r := range g.Rounds {
			history = append(history, sim.ChatMessage{Role: "user", Content: PseudoTokens(seedOf(g.Seed, 4, u, r), g.QuestionTokens)})
			msgs := append([]sim.ChatMessage(nil), history...)
			w.Requests = append(w.Requests, Request{
				Arrival:      t,
				Model:        modelOr(g.Model),
				Session:      fmt.Sprintf("user-%d", u),
				Messages:     msgs,
				PromptTokens: sim.CountTokens(sim.RenderChat(msgs)),
				OutputTokens: g.OutputTokens,
			})
			// The simulated engine's answer is pseudo-text too; the next turn
			// carries it back, as a chat client does.
			history = append(history, sim.ChatMessage{Role: "assistant", Content: PseudoTokens(seedOf(g.Seed, 5, u, r), g.OutputTokens)})
			t += g.ThinkTime
		}
	}
	sortByArrival(w)
	return w, nil
}

// RAG is retrieval-augmented generation: a corpus of Documents shared by all
// queries; each query's prompt is a system prompt, DocsPerQuery documents
// drawn with a Zipf-like popularity in random order, then a question. The
// same document at a different position is a different prefix, which is why
// RAG hit ratios depend on document order.
type RAG struct {
	Queries        int
	Documents      int
	DocsPerQuery   int
	DocTokens      int
	SystemTokens   int
	QuestionTokens int
	OutputTokens   int
	Rate           float64
	Seed           uint64
	Model          string
}

// Generate builds the workload.
func (g RAG) Generate() (*Workload, error) {
	if g.Queries < 1 || g.Documents < 1 || g.DocsPerQuery < 1 || g.DocsPerQuery > g.Documents || g.DocTokens < 1 || g.QuestionTokens < 1 || g.OutputTokens < 1 {
		return nil, fmt.Errorf("RAG workload needs queries, documents >= docs per query >= 1, doc, question and output tokens >= 1 (got %+v)", g)
	}
	rng := rand.New(rand.NewPCG(g.Seed, 3))
	docs := make([]string, g.Documents)
	for i := range docs {
		docs[i] = PseudoTokens(seedOf(g.Seed, 6, i, 0), g.DocTokens)
	}
	system := PseudoTokens(seedOf(g.Seed, 7, 0, 0), g.SystemTokens)
	// Popularity ~ 1/(rank+1): a few documents are retrieved often.
	weights := make([]float64, g.Documents)
	var sum float64
	for i := range weights {
		weights[i] = 1 / float64(i+1)
		sum += weights[i]
	}
	pick := func() int {
		x := rng.Float64() * sum
		for i, wt := range weights {
			if x < wt {
				return i
			}
			x -= wt
		}
		return len(weights) - 1
	}
	at := arrivals(rng, g.Queries, g.Rate)
	w := &Workload{Name: fmt.Sprintf("rag %d queries over %d docs", g.Queries, g.Documents)}
	for q := range g.Queries {
		chosen := map[int]bool{}
		order := make([]int, 0, g.DocsPerQuery)
		for len(order) < g.DocsPerQuery {
			d := pick()
			if !chosen[d] {
				chosen[d] = true
				order = append(order, d)
			}
		}
		text := system
		for _, d := range order {
			text += docs[d]
		}
		text += PseudoTokens(seedOf(g.Seed, 8, q, 0), g.QuestionTokens)
		w.Requests = append(w.Requests, Request{
			Arrival:      at[q],
			Model:        modelOr(g.Model),
			Session:      fmt.Sprintf("rag-%d", q),
			Prompt:       text,
			PromptTokens: sim.CountTokens(text),
			OutputTokens: g.OutputTokens,
			ID:           q, // arrivals are in query order
		})
	}
	return w, nil
}

func modelOr(m string) string {
	if m == "" {
		return "llama-3-8b"
	}
	return m
}

func stamp(w *Workload, at []time.Duration) {
	for i := range w.Requests {
		w.Requests[i].Arrival = at[i]
		w.Requests[i].ID = i
	}
}

func sortByArrival(w *Workload) {
	sort.SliceStable(w.Requests, func(i, j int) bool { return w.Requests[i].Arrival < w.Requests[j].Arrival })
	for i := range w.Requests {
		w.Requests[i].ID = i
	}
}

// Scale multiplies the workload's request rate by factor (arrivals divided).
func (w *Workload) Scale(factor float64) {
	if factor <= 0 || factor == 1 || math.IsInf(factor, 0) {
		return
	}
	for i := range w.Requests {
		w.Requests[i].Arrival = time.Duration(float64(w.Requests[i].Arrival) / factor)
	}
}
