package scorer

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute/config"
)

// FuzzParseConfig: any input either builds a handler that decides without
// panicking, or fails with config.Errors. Never a panic, never another
// error type, never a handler that cannot decide.
func FuzzParseConfig(f *testing.F) {
	for _, name := range PresetNames() {
		src, _ := PresetConfig(name)
		f.Add([]byte(src))
	}
	for _, s := range []string{
		``, `{}`, `null`, `[]`, `"x"`, `{"strategy": 1}`, `{"plugins": [{"name": "a", "type": "load_guard", "params": {"relative": 1e308}}]}`,
		`{"profiles": {"p": {"scorers": [{"plugin": "queue", "weight": 1e400}]}}, "strategy": "p"}`,
		`{"profiles": {"p": {"filters": ["healthy", "healthy"], "scorers": ["prefix_cache", "pending_tokens"], "picker": "weighted_random"}}, "strategy": "p"}`,
		`{"disaggregation": {"prefillStrategy": "prefix_hash", "threshold": 0}}`,
		`{"profiles": {"a": {"picker": "b"}, "b": {"picker": "random"}}, "strategy": "a"}`,
		`{"plugins": [{"name": "max_score", "type": "random"}], "profiles": {"p": {"scorers": ["queue"]}}, "strategy": "p"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse(data)
		var ce config.Errors
		if err != nil {
			if !errors.As(err, &ce) || len(ce) == 0 {
				t.Fatalf("ParseConfig error %T %v is not config.Errors", err, err)
			}
			return
		}
		h, _, err := Build(cfg)
		if err != nil {
			if !errors.As(err, &ce) || len(ce) == 0 {
				t.Fatalf("Build error %T %v is not config.Errors", err, err)
			}
			return
		}
		if h == nil || h.Decode == nil || h.Decode.Picker == nil {
			t.Fatalf("valid configuration built an unusable handler: %+v", h)
		}
		hosts := fleet(5)
		hosts[1].Role, hosts[2].Role = RolePrefill, RoleDecode
		hosts[3].PendingPrefillTokens, hosts[4].InFlight = 1<<40, 3
		req := newReq(5, 2000, 8)
		req.MatchedBlocks = []int32{8, 0, 3, 0, 1}
		req.MatchedTokens = []int32{2000, 0, 700, 0, 250}
		req.PrefixHash = 99
		r := h.Run(req, hosts, NewScratch(1))
		for _, o := range r.Decode.Order {
			if o < 0 || o >= len(hosts) {
				t.Fatalf("order %v out of range", r.Decode.Order)
			}
		}
		_ = r.Explain(req, hosts)
	})
}
