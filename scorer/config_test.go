package scorer

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
)

func TestConfigErrorsNameTheirPath(t *testing.T) {
	cases := []struct {
		name, config string
		path, msg    string // one of the errors must have this path and contain msg
	}{
		{"root not an object", `[1,2]`, "", "must be a JSON object"},
		{"strategy not a string", `{"strategy": 3}`, "strategy", "must be a string"},
		{"unknown strategy", `{"strategy": "fastest"}`, "strategy", `unknown strategy "fastest"; presets: round_robin`},
		{"plugins not an array", `{"plugins": {}}`, "plugins", "must be an array"},
		{"plugin not an object", `{"plugins": ["healthy"]}`, "plugins[0]", "must be an object"},
		{"unknown plugin field", `{"plugins": [{"name": "a", "type": "healthy", "parms": {}}]}`, "plugins[0].parms", "unknown key (known keys: name, params, type)"},
		{"missing name", `{"plugins": [{"type": "healthy"}]}`, "plugins[0].name", "missing"},
		{"missing type", `{"plugins": [{"name": "a"}]}`, "plugins[0].type", "missing"},
		{"unknown plugin type", `{"plugins": [{"name": "a", "type": "magic"}]}`, "plugins[0].type", `unknown plugin type "magic"; known:`},
		{"duplicate names", `{"plugins": [{"name": "a", "type": "healthy"}, {"name": "a", "type": "role"}]}`, "plugins[1].name", `duplicate name "a" (first defined at plugins[0])`},
		{"unknown parameter", `{"plugins": [{"name": "g", "type": "load_guard", "params": {"absolute": 5}}]}`, "plugins[0].params.absolute", "unknown key (known keys: absoluteTokens, basis, decodeWeight, prefixCredit, relative, waitingTokens)"},
		{"parameter of a parameterless plugin", `{"plugins": [{"name": "p", "type": "session_affinity", "params": {"x": 1}}]}`, "plugins[0].params.x", "takes no parameters"},
		{"parameter out of range", `{"plugins": [{"name": "h", "type": "consistent_hash", "params": {"loadFactor": 0.5}}]}`, "plugins[0].params.loadFactor", "must be in [1, 100]"},
		{"parameter wrong type", `{"plugins": [{"name": "h", "type": "consistent_hash", "params": {"loadFactor": "1.25"}}]}`, "plugins[0].params.loadFactor", "must be a number, got a string"},
		{"parameter not whole", `{"plugins": [{"name": "s", "type": "saturation", "params": {"maxWaiting": 1.5}}]}`, "plugins[0].params.maxWaiting", "whole number"},
		{"enum parameter", `{"plugins": [{"name": "r", "type": "role", "params": {"role": "encode"}}]}`, "plugins[0].params.role", `"encode" is not one of auto, prefill, decode, both`},
		{"profiles not an object", `{"profiles": []}`, "profiles", "must be an object"},
		{"profile not an object", `{"profiles": {"p": 1}}`, "profiles.p", "must be an object"},
		{"unknown profile field", `{"profiles": {"p": {"picker": "random", "scorer": []}}}`, "profiles.p.scorer", "unknown key"},
		{"empty profile", `{"profiles": {"p": {}}}`, "profiles.p", "empty profile"},
		{"negative weight", `{"profiles": {"default": {"scorers": ["queue", "running", {"plugin": "kv_utilization", "weight": -1}]}}}`, "profiles.default.scorers[2].weight", "must be >= 0"},
		{"weight too large", `{"profiles": {"p": {"scorers": [{"plugin": "queue", "weight": 5000}]}}}`, "profiles.p.scorers[0].weight", "must be <= 1000"},
		{"weight not a number", `{"profiles": {"p": {"scorers": [{"plugin": "queue", "weight": "2"}]}}}`, "profiles.p.scorers[0].weight", "must be a number"},
		{"unknown scorer ref field", `{"profiles": {"p": {"scorers": [{"plugin": "queue", "wieght": 2}]}}}`, "profiles.p.scorers[0].wieght", "unknown key"},
		{"undefined plugin", `{"profiles": {"p": {"filters": ["healthy", "nope"], "picker": "random"}}}`, "profiles.p.filters[1]", `"nope" is not defined in plugins and is not a built-in filter`},
		{"undefined picker", `{"profiles": {"p": {"scorers": ["queue"], "picker": "best"}}}`, "profiles.p.picker", `"best" is not defined`},
		{"filter used as scorer", `{"profiles": {"p": {"scorers": ["healthy"]}}}`, "profiles.p.scorers[0].plugin", `"healthy" is a filter, not a scorer`},
		{"scorer used as picker", `{"profiles": {"p": {"scorers": ["queue"], "picker": "queue"}}}`, "profiles.p.picker", `"queue" is a scorer, not a picker`},
		{"filter name not a string", `{"profiles": {"p": {"filters": [1], "picker": "random"}}}`, "profiles.p.filters[0]", "must be a string"},
		{"scorer listed twice", `{"profiles": {"p": {"scorers": ["queue", {"plugin": "queue", "weight": 2}]}}}`, "profiles.p.scorers[1].plugin", "already listed at profiles.p.scorers[0]"},
		{"all weights zero", `{"profiles": {"p": {"scorers": [{"plugin": "queue", "weight": 0}]}}}`, "profiles.p.scorers", "every weight is 0"},
		{"hotspot recipe", `{"profiles": {"p": {"scorers": ["prefix_cache", "session_affinity"]}}}`, "profiles.p", "hotspot recipe"},
		{"hotspot recipe with a zero-weight spreader", `{"profiles": {"p": {"scorers": ["prefix_cache", {"plugin": "queue", "weight": 0}]}}}`, "profiles.p", "hotspot recipe"},
		{"allowHotspot not a bool", `{"profiles": {"p": {"scorers": ["queue"], "allowHotspot": "yes"}}}`, "profiles.p.allowHotspot", "must be true or false"},
		{"bad index hint", `{"profiles": {"p": {"scorers": ["queue"], "index": {"blockChars": 0}}}}`, "profiles.p.index.blockChars", "must be a whole number in [1,"},
		{"unknown index hint", `{"profiles": {"p": {"scorers": ["queue"], "index": {"blocks": 5}}}}`, "profiles.p.index.blocks", "unknown key"},
		{"negative prefill threshold", `{"disaggregation": {"threshold": -1}}`, "disaggregation.threshold", "must be a whole number in [0,"},
		{"unknown prefill strategy", `{"disaggregation": {"prefillStrategy": "x"}}`, "disaggregation.prefillStrategy", `unknown strategy "x"`},
		{"unknown disaggregation field", `{"disaggregation": {"treshold": 5}}`, "disaggregation.treshold", "unknown key"},
		{"broken unused profile", `{"strategy": "round_robin", "profiles": {"spare": {"scorers": [{"plugin": "queue", "weight": -2}]}}}`, "profiles.spare.scorers[0].weight", "must be >= 0"},
		{"broken unused plugin", `{"plugins": [{"name": "g", "type": "load_guard", "params": {"relative": 0}}]}`, "plugins[0].params.relative", "must be in [1, 1000]"},
		{"negative prefix credit", `{"plugins": [{"name": "g", "type": "load_guard", "params": {"prefixCredit": -1}}]}`, "plugins[0].params.prefixCredit", "must be in [0, 100]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := buildErr(tc.config)
			var ce config.Errors
			if !errors.As(err, &ce) {
				t.Fatalf("got %v, want config.Errors", err)
			}
			for _, fe := range ce {
				if fe.Path == tc.path && strings.Contains(fe.Msg, tc.msg) {
					return
				}
			}
			t.Fatalf("no error at %s containing %q; got: %v", tc.path, tc.msg, err)
		})
	}
}

func buildErr(config string) error {
	_, _, _, err := Load([]byte(config))
	return err
}

func TestConfigReportsEveryMistakeAtOnce(t *testing.T) {
	err := buildErr(`{"plugins": [{"name": "a", "type": "magic"}],
		"profiles": {"p": {"scorers": [{"plugin": "queue", "weight": -1}], "picker": "nope"}}}`)
	var ce config.Errors
	if !errors.As(err, &ce) || len(ce) != 3 {
		t.Fatalf("want 3 errors, got %v", err)
	}
	if !strings.HasPrefix(err.Error(), "plugins[0].type: ") {
		t.Fatalf("message %q", err.Error())
	}
}

func TestValidConfigs(t *testing.T) {
	cases := []struct {
		name, config, strategy string
		warn                   string // a warning must contain it ("" = none expected)
		check                  func(t *testing.T, h *Handler)
	}{
		{name: "empty means the default", config: ``, strategy: "kv_cache_aware"},
		{name: "other keys are the filter's", config: `{"endpoints": [{"address": "1.2.3.4:80"}], "destinationHeader": "x"}`, strategy: "kv_cache_aware"},
		{name: "preset by name", config: `{"strategy": "gie_default"}`, strategy: "gie_default",
			check: func(t *testing.T, h *Handler) {
				if h.Decode.Index == nil || h.Decode.Index.BlockChars != 64 || h.Decode.Index.CapacityBlocksPerHost != 31250 {
					t.Fatalf("gie_default index hint %+v", h.Decode.Index)
				}
				want := map[string]float64{"prefix_blocks": 3, "queue": 2, "kv_utilization": 2}
				for _, s := range h.Decode.Scorers {
					if want[s.Name] != s.Weight {
						t.Fatalf("gie_default %s weight %v", s.Name, s.Weight)
					}
					delete(want, s.Name)
				}
				if len(want) != 0 {
					t.Fatalf("gie_default misses %v", want)
				}
			}},
		{name: "bare built-in types", config: `{"strategy": "mine", "profiles": {"mine": {
			"filters": ["healthy", "model"], "scorers": ["prefix_cache", {"plugin": "pending_tokens", "weight": 2}], "picker": "max_score"}}}`,
			strategy: "mine",
			check: func(t *testing.T, h *Handler) {
				if len(h.Decode.Filters) != 2 || len(h.Decode.Scorers) != 2 || h.Decode.Scorers[1].Weight != 2 || h.Decode.Scorers[0].Weight != 1 {
					t.Fatalf("profile %+v", h.Decode)
				}
			}},
		{name: "named instance with parameters", config: `{"strategy": "p", "plugins": [{"name": "ch", "type": "consistent_hash", "params": {"loadFactor": 2}}],
			"profiles": {"p": {"picker": "ch"}}}`, strategy: "p",
			check: func(t *testing.T, h *Handler) {
				if h.Decode.Picker.(consistentHashPicker).loadFactor != 2 {
					t.Fatal("loadFactor not applied")
				}
			}},
		{name: "redefined preset", config: `{"profiles": {"kv_cache_aware": {"scorers": ["least_request"]}}}`, strategy: "kv_cache_aware",
			check: func(t *testing.T, h *Handler) {
				if len(h.Decode.Scorers) != 1 || h.Decode.Scorers[0].Name != "least_request" {
					t.Fatal("the configured profile did not replace the preset")
				}
			}},
		{name: "hotspot allowed with a warning", config: `{"strategy": "p", "profiles": {"p": {"scorers": ["prefix_cache"], "allowHotspot": true}}}`,
			strategy: "p", warn: "allowed by allowHotspot"},
		{name: "scorers without a score picker warn", config: `{"strategy": "p", "profiles": {"p": {"filters": ["healthy"]}}}`,
			strategy: "p", warn: "every pick is a random tie-break"},
		{name: "disaggregation", config: `{"disaggregation": {"prefillStrategy": "prefix_hash", "threshold": 1024}}`, strategy: "kv_cache_aware",
			check: func(t *testing.T, h *Handler) {
				if h.Prefill == nil || h.Prefill.Name != "prefix_hash" || h.PrefillThreshold != 1024 {
					t.Fatalf("prefill %+v threshold %d", h.Prefill, h.PrefillThreshold)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			h, warnings, err := Build(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if h.Name != tc.strategy || h.Decode == nil {
				t.Fatalf("handler %q, want %q", h.Name, tc.strategy)
			}
			joined := strings.Join(warnings, "\n")
			if tc.warn == "" && joined != "" || tc.warn != "" && !strings.Contains(joined, tc.warn) {
				t.Fatalf("warnings %q, want %q", joined, tc.warn)
			}
			if tc.check != nil {
				tc.check(t, h)
			}
		})
	}
}

// Every preset is valid JSON built by the validating code path, and is not
// the hotspot recipe unless it says so.
func TestPresetsAreValidConfigs(t *testing.T) {
	for _, name := range PresetNames() {
		src, ok := PresetConfig(name)
		if !ok {
			t.Fatalf("%s has no config", name)
		}
		cfg, err := config.Parse([]byte(src))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		cfg.Strategy = name
		if _, _, err := Build(cfg); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if _, err := Preset("nope"); err == nil || !strings.Contains(err.Error(), "presets: round_robin, random") {
		t.Fatalf("unknown preset error: %v", err)
	}
}

// TestReadsLatency checks what the filter relies on to skip timing
// responses: only a profile with the latency scorer reads host latency.
func TestReadsLatency(t *testing.T) {
	for _, name := range PresetNames() {
		h, err := NewHandler(name)
		if err != nil {
			t.Fatal(err)
		}
		if h.ReadsLatency() {
			t.Errorf("preset %s reads latency; the filter would time every response", name)
		}
	}
	cfg, err := config.Parse([]byte(`{"strategy": "p", "profiles": {"p": {"scorers": ["queue", "latency"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !h.ReadsLatency() {
		t.Error("a profile with the latency scorer does not report that it reads latency")
	}
}
