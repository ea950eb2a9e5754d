package workload

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
)

func TestExpandHashIDsSharesPrefixesAndCutsLastBlock(t *testing.T) {
	a := ExpandHashIDs([]int64{1, 2, 3}, 1200)
	b := ExpandHashIDs([]int64{1, 2, 9}, 1100)
	if len(a) != 1200*sim.CharsPerToken || len(b) != 1100*sim.CharsPerToken {
		t.Fatalf("lengths %d and %d, want %d and %d", len(a), len(b), 4800, 4400)
	}
	if a[:4096] != b[:4096] {
		t.Fatal("equal leading hash ids expanded to different text")
	}
	if a[4096:4400] == b[4096:4400] {
		t.Fatal("different hash ids expanded to the same text")
	}
	if ExpandHashIDs([]int64{1, 2, 3}, 1200) != a {
		t.Fatal("expansion is not deterministic")
	}
	// The same id at the same position gives the same bytes as a full block.
	if ExpandHashIDs([]int64{1}, 512) != a[:2048] {
		t.Fatal("block text depends on more than its id")
	}
}

func TestReadMooncakeErrorsNameTheLine(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`
	cases := map[string]string{
		good + "\n{not json": "line 2",
		`{"input_length": 10, "output_length": 1, "hash_ids": [1]}`:                                                                                       "missing timestamp",
		`{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`:                                                                         "input_length must be positive",
		`{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1]}`:                                                                     "do not cover",
		`{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [1]}` + "\n" + strings.Replace(good, `"timestamp": 0`, `"timestamp": 1`, 1): "goes back in time",
		"": "no requests",
	}
	for in, want := range cases {
		_, err := ReadMooncake(strings.NewReader(in), TraceOptions{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("input %q: error %v, want it to mention %q", in, err, want)
		}
	}
	w, err := ReadMooncake(strings.NewReader(good+"\n"+strings.Replace(good, `"timestamp": 0`, `"timestamp": 1000`, 1)), TraceOptions{RateScale: 4})
	if err != nil {
		t.Fatal(err)
	}
	if w.Requests[1].Arrival != 250*time.Millisecond {
		t.Fatalf("rate scale 4: second arrival at %v, want 250ms", w.Requests[1].Arrival)
	}
	if got := sim.CountTokens(w.Requests[0].Text()); got != 600 {
		t.Fatalf("expanded prompt is %d tokens, want 600", got)
	}
	if w.Requests[0].Session != "" {
		t.Fatalf("the trace has no session ids, got %q", w.Requests[0].Session)
	}
	w, _ = ReadMooncake(strings.NewReader(good), TraceOptions{SessionsFromPrefix: true})
	if w.Requests[0].Session != "trace-1" {
		t.Fatalf("session from the first hash id: got %q", w.Requests[0].Session)
	}
}

func TestMultiTurnHistoryGrowsAsPrefix(t *testing.T) {
	w, err := MultiTurn{Users: 3, Rounds: 4, SystemTokens: 100, QuestionTokens: 50, OutputTokens: 20, Rate: 1, ThinkTime: time.Second, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 12 {
		t.Fatalf("%d requests, want 12", len(w.Requests))
	}
	last := map[string]string{}
	for i, r := range w.Requests {
		if i > 0 && r.Arrival < w.Requests[i-1].Arrival {
			t.Fatal("requests not ordered by arrival")
		}
		text := r.Text()
		if !r.Chat() {
			t.Fatal("multi-turn requests must be chat requests")
		}
		if prev, ok := last[r.Session]; ok {
			// The previous turn's rendering, minus the generation prompt,
			// is a prefix of this one.
			if !strings.HasPrefix(text, prev[:len(prev)-len("<|assistant|>\n")]) {
				t.Fatalf("turn of %s does not extend the previous turn", r.Session)
			}
		}
		last[r.Session] = text
	}
}

func TestSharedPrefixAndRAG(t *testing.T) {
	w, err := SharedPrefix{Groups: 4, PromptsPerGroup: 5, SystemTokens: 256, QuestionTokens: 32, OutputTokens: 8, Rate: 10, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	prefixes := map[string]int{}
	for _, r := range w.Requests {
		prefixes[r.Prompt[:256*sim.CharsPerToken]]++
		if r.PromptTokens != 288 {
			t.Fatalf("prompt of %d tokens, want 288", r.PromptTokens)
		}
	}
	if len(prefixes) != 4 {
		t.Fatalf("%d distinct system prompts, want 4", len(prefixes))
	}
	for _, n := range prefixes {
		if n != 5 {
			t.Fatalf("group sizes %v, want 5 each", prefixes)
		}
	}
	rag, err := RAG{Queries: 50, Documents: 10, DocsPerQuery: 3, DocTokens: 200, SystemTokens: 50, QuestionTokens: 20, OutputTokens: 10, Rate: 5, Seed: 2}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	firstDocs := map[string]bool{}
	for _, r := range rag.Requests {
		if r.PromptTokens != 50+600+20 {
			t.Fatalf("RAG prompt of %d tokens", r.PromptTokens)
		}
		firstDocs[r.Prompt[200:200+800]] = true
	}
	if len(firstDocs) < 2 || len(firstDocs) > 10 {
		t.Fatalf("%d distinct leading documents over 50 queries of a 10-document corpus", len(firstDocs))
	}
	if _, err := (RAG{Queries: 1, Documents: 2, DocsPerQuery: 3, DocTokens: 1, QuestionTokens: 1, OutputTokens: 1}).Generate(); err == nil {
		t.Fatal("more documents per query than documents accepted")
	}
}

// A conversation keeps its adapter, popular adapters get more requests,
// and n = 0 takes adapters away.
func TestAssignAdapters(t *testing.T) {
	w, err := MultiTurn{Users: 300, Rounds: 3, SystemTokens: 100, QuestionTokens: 50, OutputTokens: 10, Rate: 10, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	w.AssignAdapters(8, 1)
	bySession, count := map[string]string{}, map[string]int{}
	for _, r := range w.Requests {
		if a, ok := bySession[r.Session]; ok && a != r.Adapter {
			t.Fatalf("session %s runs %s and %s", r.Session, a, r.Adapter)
		}
		bySession[r.Session] = r.Adapter
		count[r.Adapter]++
	}
	if len(count) < 6 || count["lora-0"] <= 2*count["lora-7"] {
		t.Errorf("adapter counts %v: want most of 8 adapters used, lora-0 well ahead of lora-7", count)
	}
	w.AssignAdapters(0, 1)
	if w.Requests[0].Adapter != "" {
		t.Error("n = 0 left adapters")
	}
}

// Every generator numbers its requests 0..n-1 in arrival order: the fleet
// simulator keys a request's router ticket by its ID, and two requests
// with one ID would leave one's load counted for ever.
func TestGeneratorsNumberRequests(t *testing.T) {
	gens := map[string]interface{ Generate() (*Workload, error) }{
		"shared-prefix": SharedPrefix{Groups: 4, PromptsPerGroup: 5, SystemTokens: 100, QuestionTokens: 20, OutputTokens: 5, Rate: 10, Seed: 1},
		"multi-turn":    MultiTurn{Users: 5, Rounds: 3, SystemTokens: 100, QuestionTokens: 20, OutputTokens: 5, Rate: 10, Seed: 1},
		"rag":           RAG{Queries: 20, Documents: 10, DocsPerQuery: 2, DocTokens: 50, SystemTokens: 20, QuestionTokens: 10, OutputTokens: 5, Rate: 10, Seed: 1},
	}
	for name, g := range gens {
		w, err := g.Generate()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for i, r := range w.Requests {
			if r.ID != i || i > 0 && r.Arrival < w.Requests[i-1].Arrival {
				t.Fatalf("%s: request %d has ID %d (arrival %v)", name, i, r.ID, r.Arrival)
			}
		}
	}
}
