package index_test

import (
	"fmt"

	"github.com/kvroute/kvroute/index"
)

// One routing decision as the router filter makes it: hash the prompt,
// ask which host holds the longest prefix, record the choice, count the
// load, release it at stream end.
func Example() {
	store := &index.MemStore{} // the filter passes its shared-data adapter
	ix, err := index.New(store, index.Config{})
	if err != nil {
		panic(err)
	}
	a, _ := ix.Register("10.0.0.7:8000")
	b, _ := ix.Register("10.0.0.8:8000")
	ix.SetCapacity(a, 16*20000) // block_size x num_gpu_blocks
	ix.SetCapacity(b, 16*20000)

	h := index.NewHasher(ix.Config().Hash)
	system := "You are a careful assistant. Answer in French. "
	for i := 0; i < 6; i++ {
		system += system
	}
	prompt := func(question string) []uint64 {
		h.Reset("llama-3-8b", "", "")
		h.Message("system", system)
		h.Message("user", question)
		return h.Blocks()
	}

	var m index.Matches
	first := prompt("What is the capital of Italy?")
	ix.Query(first, &m)
	ix.Record(b, first, &m) // routed to b

	second := prompt("And of Spain?")
	ix.Query(second, &m)
	slot, blocks := m.Best()
	fmt.Printf("best host slot %d, %d of %d blocks, about %d of %d tokens cached\n",
		slot, blocks, len(second), h.TokensIn(blocks), h.PromptTokens())

	ticket, _ := ix.AddLoadKV(b, h.PromptTokens()-h.TokensIn(blocks), 256, h.PromptTokens()+256)
	fmt.Printf("load on b: %+v\n", ix.Loads(nil)[b.Slot])
	ix.Release(&ticket)
	ix.Release(&ticket) // a reset after the normal end: no effect
	fmt.Printf("after release: %+v\n", ix.Loads(nil)[b.Slot])
	_ = a
	// Output:
	// best host slot 1, 11 of 11 blocks, about 704 of 760 tokens cached
	// load on b: {InFlight:1 PrefillTokens:56 DecodeTokens:256 KVTokens:1016}
	// after release: {InFlight:0 PrefillTokens:0 DecodeTokens:0 KVTokens:0}
}
