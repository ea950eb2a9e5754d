package replay

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim/server"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

func TestReplayAgainstASimulatedEngine(t *testing.T) {
	f, err := server.Start(server.Options{TimeScale: 0.02})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sp, _ := workload.SharedPrefix{Groups: 2, PromptsPerGroup: 5, SystemTokens: 800, QuestionTokens: 40, OutputTokens: 6, Rate: 50, Seed: 1}.Generate()
	mt, _ := workload.MultiTurn{Users: 2, Rounds: 3, SystemTokens: 300, QuestionTokens: 30, OutputTokens: 4, Rate: 20, ThinkTime: time.Second, Seed: 2}.Generate()
	w := &workload.Workload{Requests: append(sp.Requests, mt.Requests...)}
	start := time.Now()
	recs, err := Run(context.Background(), w, Options{BaseURL: "http://" + f.Addrs()[0], TimeScale: 0.02, SessionHeader: "x-session-id"})
	if err != nil {
		t.Fatal(err)
	}
	last := w.Requests[len(w.Requests)-1].Arrival
	if el := time.Since(start); el < time.Duration(float64(last)*0.02) {
		t.Fatalf("replay took %v, faster than the scaled arrivals (%v)", el, time.Duration(float64(last)*0.02))
	}
	var cached int
	for i, r := range recs {
		want := w.Requests[i]
		if r.Err != "" || r.Status != 200 {
			t.Fatalf("request %d: status %d, %s", i, r.Status, r.Err)
		}
		if r.OutputTokens != want.OutputTokens || r.PromptTokens != want.PromptTokens {
			t.Fatalf("request %d: %d/%d tokens, want %d/%d", i, r.PromptTokens, r.OutputTokens, want.PromptTokens, want.OutputTokens)
		}
		if r.TTFT <= 0 || r.E2E < r.TTFT || (r.OutputTokens > 1 && r.TPOT <= 0) {
			t.Fatalf("request %d: TTFT %v, E2E %v, TPOT %v", i, r.TTFT, r.E2E, r.TPOT)
		}
		if r.Replica != f.Addrs()[0] {
			t.Fatalf("request %d: replica header %q", i, r.Replica)
		}
		cached += r.CachedTokens
	}
	// One engine sees every repeat of the 2 system prompts and every turn's
	// history; requests that arrive while their prefix is still being
	// prefilled miss, so ask for a few repeats' worth only.
	if cached < 4*784 {
		t.Fatalf("only %d cached tokens over shared prompts and growing chats", cached)
	}
}

func TestReplayReportsHTTPErrors(t *testing.T) {
	f, err := server.Start(server.Options{TimeScale: 0.01, Model: "other-model"})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := &workload.Workload{Requests: []workload.Request{{Model: "llama-3-8b", Prompt: "hello", PromptTokens: 2, OutputTokens: 1}}}
	recs, err := Run(context.Background(), w, Options{BaseURL: "http://" + f.Addrs()[0]})
	if err != nil {
		t.Fatal(err)
	}
	if recs[0].Status != 404 || recs[0].Err == "" {
		t.Fatalf("wrong model: %+v", recs[0])
	}
	if _, err := Run(context.Background(), w, Options{}); err == nil {
		t.Fatal("no base URL accepted")
	}
}
