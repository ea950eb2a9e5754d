package fleet

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// StrategyNames are the bench contract's strategy names, in its order.
var StrategyNames = []string{
	"round_robin", "random", "least_request", "prefix_hash", "sticky_session",
	"kv_cache_aware", "sglang_cache_aware", "gie_default", "dynamo_kv",
}

// NewStrategy returns a fresh router for a bench strategy over n replicas.
func NewStrategy(name string, n int, seed uint64) (Router, error) {
	switch name {
	case "round_robin":
		return &RoundRobin{N: n}, nil
	case "random":
		return &Random{N: n, Rng: rand.New(rand.NewPCG(seed, 0x72616e64))}, nil
	}
	return nil, fmt.Errorf("unknown strategy %q (known: %s)", name, strings.Join(StrategyNames, ", "))
}
