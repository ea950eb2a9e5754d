package sim

import (
	"slices"
	"testing"
	"time"
)

// A request whose adapter is not in a GPU slot pays the load time once;
// the next request with that adapter does not.
func TestLoRALoadTimeOnMiss(t *testing.T) {
	p := testProfile(t)
	p.MaxLoRAs, p.LoRALoadTime = 2, 80*time.Millisecond
	e := NewEngine(p)
	ttft := func(adapter string, tag uint64, now time.Duration) time.Duration {
		r := &Request{PromptTokens: 512, BlockHashes: chain(tag, tag, 0, 32), MaxTokens: 1, Adapter: adapter, Arrival: now}
		if err := e.Add(r); err != nil {
			t.Fatal(err)
		}
		runAlone(e, now)
		return r.FirstToken - now
	}
	base := ttft("", 1, 0)
	if got := ttft("fin", 2, time.Second); got != base+p.LoRALoadTime {
		t.Errorf("first fin request: TTFT %v, want base %v + load %v", got, base, p.LoRALoadTime)
	}
	if got := ttft("fin", 3, 2*time.Second); got != base {
		t.Errorf("fin again (in a slot): TTFT %v, want %v", got, base)
	}
	ttft("med", 4, 3*time.Second) // second slot
	ttft("law", 5, 4*time.Second) // evicts fin, the least recently used
	if got := ttft("fin", 6, 5*time.Second); got != base+p.LoRALoadTime {
		t.Errorf("fin after eviction: TTFT %v, want %v", got, base+p.LoRALoadTime)
	}
	if st := e.Stats(); st.LoRALoads != 4 || st.MaxLoRAs != 2 {
		t.Errorf("loads %d of max %d, want 4 of 2", st.LoRALoads, st.MaxLoRAs)
	}
}

// With every slot running another adapter, a request for a new one waits
// while requests behind it (base model, or a running adapter) go ahead;
// the engine's state lists running and waiting adapters.
func TestLoRAFullEngineSkipsNewAdapter(t *testing.T) {
	p := testProfile(t)
	p.MaxLoRAs, p.LoRALoadTime = 1, 10*time.Millisecond
	e := NewEngine(p)
	long := &Request{PromptTokens: 64, BlockHashes: chain(1, 1, 0, 4), MaxTokens: 200, Adapter: "a"}
	blocked := &Request{PromptTokens: 64, BlockHashes: chain(2, 2, 0, 4), MaxTokens: 1, Adapter: "b"}
	base := &Request{PromptTokens: 64, BlockHashes: chain(3, 3, 0, 4), MaxTokens: 1}
	same := &Request{PromptTokens: 64, BlockHashes: chain(4, 4, 0, 4), MaxTokens: 1, Adapter: "a"}
	for _, r := range []*Request{long, blocked, base, same} {
		if err := e.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	e.Step(0)
	// The one-token requests behind b are done; b waits beside a's.
	if st := e.Stats(); st.Running != 1 || st.Waiting != 1 || !slices.Equal(st.Adapters, []string{"a", "b"}) || base.Generated != 1 || same.Generated != 1 {
		t.Fatalf("after one step: running %d waiting %d adapters %v (base %d, same %d tokens), want 1 1 [a b], 1 and 1", st.Running, st.Waiting, st.Adapters, base.Generated, same.Generated)
	}
	end := runAlone(e, 0)
	if blocked.FirstToken < long.Finished {
		t.Errorf("b started (first token %v) before a's request finished (%v) with one slot", blocked.FirstToken, long.Finished)
	}
	if base.FirstToken >= long.Finished || same.FirstToken >= long.Finished {
		t.Errorf("requests behind the blocked one waited for it: base %v, same adapter %v", base.FirstToken, same.FirstToken)
	}
	if end == 0 || !e.Idle() {
		t.Error("engine did not drain")
	}
}
