package scorer

import (
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/config"
)

// presetOrder is the bench contract's strategy list (docs/simulator.md).
var presetOrder = []string{
	"round_robin", "random", "least_request", "prefix_hash", "sticky_session",
	"kv_cache_aware", "sglang_cache_aware", "gie_default", "dynamo_kv",
}

// presetConfigs define every built-in strategy in the same JSON an operator
// writes, and are built by the same validating code: a preset is a profile
// that happens to ship with kvroute. Copy one into "profiles" to tune it.
var presetConfigs = map[string]string{
	"round_robin": `{"profiles": {"round_robin": {
		"filters": ["healthy", "role", "model"], "picker": "round_robin"}}}`,
	"random": `{"profiles": {"random": {
		"filters": ["healthy", "role", "model"], "picker": "random"}}}`,
	"least_request": `{"profiles": {"least_request": {
		"filters": ["healthy", "role", "model"],
		"scorers": [{"plugin": "least_request", "weight": 1}], "picker": "max_score"}}}`,
	"prefix_hash": `{"profiles": {"prefix_hash": {
		"filters": ["healthy", "role", "model"], "picker": "consistent_hash"}}}`,
	// Round robin among ties: with no pin every host ties at 0.
	"sticky_session": `{
		"plugins": [{"name": "rr_ties", "type": "max_score", "params": {"tieBreak": "round_robin"}}],
		"profiles": {"sticky_session": {
		"filters": ["healthy", "role", "model"],
		"scorers": [{"plugin": "session_affinity", "weight": 1}],
		"picker": "rr_ties", "allowHotspot": true}}}`,
	// kvroute's default; tuned on the shared Mooncake trace with the fleet
	// simulator (docs/strategies.md explains every knob).
	"kv_cache_aware": `{
		"plugins": [
		  {"name": "guard", "type": "load_guard",
		   "params": {"absoluteTokens": 65536, "relative": 2, "basis": "cost", "decodeWeight": 0.05}},
		  {"name": "cost", "type": "prefill_cost", "params": {"scaleTokens": 16384, "decodeWeight": 0.05}},
		  {"name": "prefix", "type": "prefix_cache", "params": {"scaleTokens": 8192, "preciseScale": 0.6667}}],
		"profiles": {"kv_cache_aware": {
		"filters": ["healthy", "role", "model", "saturation", "guard"],
		"scorers": [{"plugin": "prefix", "weight": 3},
		            {"plugin": "cost", "weight": 3},
		            {"plugin": "kv_utilization", "weight": 1.5},
		            {"plugin": "prefix_memory", "weight": 1.5},
		            {"plugin": "session_affinity", "weight": 1.5},
		            {"plugin": "lora_affinity", "weight": 3}],
		"picker": "max_score", "correctIndex": true}}}`,
	"sglang_cache_aware": `{"profiles": {"sglang_cache_aware": {
		"filters": ["healthy", "role", "model"], "picker": "sglang_cache_aware"}}}`,
	// GIE / llm-d default scheduling profile: prefix-cache-scorer 3,
	// queue-scorer 2, kv-cache-utilization-scorer 2, max-score-picker; its
	// approximate prefix index uses 64-character blocks and an LRU of 31,250
	// blocks per pod (kubernetes-sigs/gateway-api-inference-extension,
	// site-src/guides/epp-configuration/prefix-aware.md; the prefix score is
	// matched over total blocks, the queue score min-max normalised).
	"gie_default": `{
		"plugins": [{"name": "prefix_blocks", "type": "prefix_cache", "params": {"unit": "blocks"}}],
		"profiles": {"gie_default": {
		"filters": ["healthy", "role", "model"],
		"scorers": [{"plugin": "prefix_blocks", "weight": 3},
		            {"plugin": "queue", "weight": 2},
		            {"plugin": "kv_utilization", "weight": 2}],
		"picker": "max_score",
		"index": {"blockChars": 64, "capacityBlocksPerHost": 31250}}}}`,
	"dynamo_kv": `{"profiles": {"dynamo_kv": {
		"filters": ["healthy", "role", "model"], "picker": "dynamo_kv"}}}`,
}

// PresetNames lists the built-in strategies in the bench contract's order.
func PresetNames() []string { return append([]string(nil), presetOrder...) }

// PresetConfig returns the JSON that defines a preset, for operators who
// want to start from it.
func PresetConfig(name string) (string, bool) {
	s, ok := presetConfigs[name]
	return s, ok
}

// Preset builds a fresh profile for a built-in strategy (fresh: stateful
// pickers such as round robin do not share counters between handlers).
func Preset(name string) (*Profile, error) {
	src, ok := presetConfigs[name]
	if !ok {
		return nil, fmt.Errorf("unknown strategy %q; presets: %s", name, strings.Join(presetOrder, ", "))
	}
	cfg, err := config.Parse([]byte(src))
	if err != nil {
		return nil, fmt.Errorf("preset %s: %w", name, err)
	}
	errs := &config.Errors{}
	b := newBuilder(cfg, errs)
	var p *Profile
	for i := range cfg.Profiles {
		if cfg.Profiles[i].Name == name {
			p = b.profile(&cfg.Profiles[i])
		}
	}
	if err := errs.Err(); err != nil {
		return nil, fmt.Errorf("preset %s: %w", name, err)
	}
	return p, nil
}

// NewHandler returns the handler of a strategy name with no configuration:
// a preset. It is what the simulator and `kvroute bench` use.
func NewHandler(strategy string) (*Handler, error) {
	p, err := Preset(strategy)
	if err != nil {
		return nil, err
	}
	return &Handler{Name: strategy, Decode: p, MaxPicks: 3}, nil
}
