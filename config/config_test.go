package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/snapshot"
)

func TestParseDefaults(t *testing.T) {
	for _, in := range []string{"", "  \n", "{}"} {
		c, err := Parse([]byte(in))
		if err != nil {
			t.Fatalf("Parse(%q): %v", in, err)
		}
		if c.DestinationHeader != DefaultDestinationHeader || c.Strategy != DefaultStrategy ||
			!c.BodyRouting || c.MaxBodyBytes != DefaultMaxBodyBytes || c.Fallbacks != DefaultFallbacks ||
			c.State.Path != DefaultStatePath || c.TestHooks || len(c.Endpoints) != 0 || c.StreamUsage != StreamUsageRequested ||
			len(c.InferencePaths) != len(DefaultInferencePaths) {
			t.Errorf("Parse(%q) defaults wrong: %+v", in, c)
		}
	}
}

func TestParseFull(t *testing.T) {
	c, err := Parse([]byte(`{
	  "endpoints": [
	    {"address": "10.0.0.7:8000", "role": "prefill", "model": "llama-3-8b"},
	    {"address": "[fd00::1]:8000", "dataParallelSize": 4},
	    {"address": "vllm-1.ns.svc:8001", "role": "decode"}
	  ],
	  "strategy": "mine",
	  "profiles": {"mine": {"scorers": [{"plugin": "pending_tokens", "weight": 1}], "picker": "max_score"}},
	  "destinationHeader": "x-dest",
	  "fallbacks": 3,
	  "inferencePaths": ["/v1/completions"],
	  "rejectOtherPaths": true,
	  "bodyRouting": false,
	  "maxBodyBytes": 1048576,
	  "sessionHeader": "",
	  "prefixKeyHeader": "x-prefix-key",
	  "loraAdapters": {"sql-lora": "llama-3-8b"},
	  "state": {"path": "/state", "token": "s3cret", "staleAfterMs": 5000},
	  "circuitBreaker": {"consecutiveFailures": 3, "latencyThresholdMs": 2000, "cooldownMs": 1000},
	  "orca": true,
	  "streamUsage": "always",
	  "debugHeader": "x-kvroute-debug",
	  "testHooks": true
	}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Endpoint{{"10.0.0.7:8000", snapshot.RolePrefill, "llama-3-8b", 0}, {"[fd00::1]:8000", snapshot.RoleBoth, "", 4}, {"vllm-1.ns.svc:8001", snapshot.RoleDecode, "", 0}}
	if len(c.Endpoints) != len(want) {
		t.Fatalf("endpoints = %+v", c.Endpoints)
	}
	for i := range want {
		if c.Endpoints[i] != want[i] {
			t.Errorf("endpoints[%d] = %+v, want %+v", i, c.Endpoints[i], want[i])
		}
	}
	if c.Strategy != "mine" || len(c.Profiles) != 1 || c.Profiles[0].Name != "mine" || c.Profiles[0].Path != "profiles.mine" || c.DestinationHeader != "x-dest" ||
		c.Fallbacks != 3 || len(c.InferencePaths) != 1 || !c.RejectOtherPaths || c.BodyRouting || c.MaxBodyBytes != 1<<20 ||
		c.SessionHeader != "" || c.PrefixKeyHeader != "x-prefix-key" || c.LoRAAdapters["sql-lora"] != "llama-3-8b" ||
		c.State != (State{Path: "/state", Token: "s3cret", StaleAfterMs: 5000}) ||
		c.CircuitBreaker != (CircuitBreaker{3, 2000, 1000}) || !c.ORCA || c.StreamUsage != StreamUsageAlways || c.DebugHeader != "x-kvroute-debug" || !c.TestHooks {
		t.Errorf("parsed wrong: %+v", c)
	}
}

// TestParseErrorsNameTheField is the contract the manifest checks and the
// plugin-start log line rely on: each bad field is named by its path.
func TestParseErrorsNameTheField(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{"endpoints":[{"address":"10.0.0.1:80"},{"address":"10.0.0.2"}]}`, "endpoints[1].address: \"10.0.0.2\" is not host:port"},
		{`{"endpoints":[{"address":"10.0.0.1:0"}]}`, "endpoints[0].address: \"10.0.0.1:0\": port must be a number from 1 to 65535"},
		{`{"endpoints":[{"address":"10.0.0.1:http"}]}`, "endpoints[0].address: \"10.0.0.1:http\": port must be"},
		{`{"endpoints":[{"address":":80"}]}`, "endpoints[0].address: \":80\" has no host"},
		{`{"endpoints":[{"address":"10.0.0.1:80","dataParallelSize":0}]}`, "endpoints[0].dataParallelSize: must be a whole number of data-parallel ranks from 1 to 64"},
		{`{"endpoints":[{"address":"10.0.0.1:80","dataParallelSize":2.5}]}`, "endpoints[0].dataParallelSize: must be a whole number"},
		{`{"endpoints":[{"address":"10.0.0.1:80","dataParallelSize":65}]}`, "endpoints[0].dataParallelSize: must be a whole number"},
		{`{"endpoints":[{"address":7}]}`, "endpoints[0].address: must be a string, got a number"},
		{`{"endpoints":[{"role":"both"}]}`, "endpoints[0].address: is required"},
		{`{"endpoints":[{"address":"a:1","role":"leader"}]}`, "endpoints[0].role: \"leader\" is not a role"},
		{`{"endpoints":[{"address":"a:1","weight":2}]}`, "endpoints[0].weight: unknown key"},
		{`{"endpoints":[{"address":"a:1"},{"address":"a:1"}]}`, "endpoints[1].address: \"a:1\" is already endpoints[0]"},
		{`{"endpoints":["a:1"]}`, "endpoints[0]: must be an object"},
		{`{"endpoints":{"address":"a:1"}}`, "endpoints: must be an array"},
		{`{"plugins":3}`, "plugins: must be an array"},
		{`{"profiles":{"p":{"scorers":[{"plugin":"queue","wieght":1}]}}}`, "profiles.p.scorers[0].wieght: unknown key"},
		{`{"disaggregation":{"threshold":-1}}`, "disaggregation.threshold: must be a whole number in [0,"},
		{`{"state":{"tokenEnv":"1X"}}`, "state.tokenEnv: \"1X\" is not an environment variable name"},
		{`{"strategy":""}`, "strategy: must not be empty"},
		{`{"destinationHeader":"X-Dest"}`, "destinationHeader: \"X-Dest\": header names must be lower case"},
		{`{"destinationHeader":"x dest"}`, "destinationHeader: \"x dest\" is not a valid header name"},
		{`{"destinationHeader":""}`, "destinationHeader: must not be empty"},
		{`{"fallbacks":-1}`, "fallbacks: must be between 0 and 8, got -1"},
		{`{"fallbacks":1.5}`, "fallbacks: must be a whole number"},
		{`{"fallbacks":"2"}`, "fallbacks: must be a number, got a string"},
		{`{"maxBodyBytes":0}`, "maxBodyBytes: must be between"},
		{`{"bodyRouting":"yes"}`, "bodyRouting: must be true or false, got a string"},
		{`{"testHooks":1}`, "testHooks: must be true or false, got a number"},
		{`{"streamUsage":"sometimes"}`, "streamUsage: \"sometimes\" is not a stream usage mode: use \"requested\""},
		{`{"streamUsage":true}`, "streamUsage: must be a string, got a boolean"},
		{`{"inferencePaths":["v1/completions"]}`, "inferencePaths[0]: \"v1/completions\" must start with '/'"},
		{`{"state":{"token":"a","tokenEnv":"T"}}`, "state: give token or tokenEnv, not both"},
		{`{"state":{"path":"/v1/completions"}}`, "state.path: \"/v1/completions\" is also an inference path"},
		{`{"state":{"staleAfterMs":0}}`, "state.staleAfterMs: must be between"},
		{`{"state":{"report":{"intervalMs":50}}}`, "state.report.cluster: name the Envoy cluster"},
		{`{"state":{"report":{"cluster":"m","intervalMs":1}}}`, "state.report.intervalMs: must be between"},
		{`{"state":{"report":{"cluster":"m","every":1}}}`, "state.report.every: unknown key"},
		{`{"circuitBreaker":{"cooldownMs":0}}`, "circuitBreaker.cooldownMs: must be between"},
		{`{"circuitBreaker":{"threshold":1}}`, "circuitBreaker.threshold: unknown key"},
		{`{"loraAdapters":{"a":1}}`, "loraAdapters.a: must be a string"},
		{`{"models":{"answer":"engine"}}`, `models.answer: "engine" is not an answer: use "local"`},
		{`{"models":{"answer":1}}`, "models.answer: must be a string"},
		{`{"models":"local"}`, "models: must be an object"},
		{`{"endpoint":[]}`, "endpoint: unknown key (known keys: "},
		{`{"strategy":"round_robin","strategy":"random"}`, "strategy: given twice"},
		{`{"endpoints":[`, "not valid JSON"},
		{`[1,2]`, "the configuration must be a JSON object, got an array"},
		{`"x"`, "must be a JSON object, got a string"},
	}
	for _, tc := range cases {
		c, err := Parse([]byte(tc.in))
		if err == nil {
			t.Errorf("Parse(%s) = %+v, want error %q", tc.in, c, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s) error = %q, want it to contain %q", tc.in, err, tc.want)
		}
		var es Errors
		if !errors.As(err, &es) || len(es) == 0 {
			t.Errorf("Parse(%s) error is %T, want config.Errors", tc.in, err)
		}
	}
}

func TestParseReportsEveryBadField(t *testing.T) {
	_, err := Parse([]byte(`{"endpoints":[{"address":"x"},{"address":"y:1","role":"z"}],"fallbacks":99}`))
	var es Errors
	if !errors.As(err, &es) || len(es) != 3 {
		t.Fatalf("want 3 errors, got %v", err)
	}
	paths := []string{es[0].Path, es[1].Path, es[2].Path}
	want := []string{"endpoints[0].address", "endpoints[1].role", "fallbacks"}
	for i := range want {
		if paths[i] != want[i] {
			t.Errorf("error paths = %v, want %v", paths, want)
			break
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `{"endpoints":[{"address":"10.0.0.1:8000","role":"decode"}]}`,
		`{"strategy":"least_request","plugins":[]}`, `{"state":{"path":"/s","token":"t"}}`,
		`{"endpoints":[{"address":"[::1]:1"}],"fallbacks":8}`, `{"loraAdapters":{"a":"b"}}`, `[`, `{"a":`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if c != nil {
				t.Fatal("config returned with an error")
			}
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if c.DestinationHeader == "" || c.MaxBodyBytes <= 0 || c.Fallbacks < 0 || c.Fallbacks > MaxFallbacks {
			t.Fatalf("accepted config breaks invariants: %+v", c)
		}
		seen := map[string]bool{}
		for _, e := range c.Endpoints {
			if e.Address == "" || seen[e.Address] {
				t.Fatalf("accepted endpoints invalid: %+v", c.Endpoints)
			}
			seen[e.Address] = true
		}
	})
}

func TestAddressForms(t *testing.T) {
	good := []string{"10.0.0.1:8000", "[fd00::1]:8000", "vllm-0.vllm.ns.svc.cluster.local:8000", "localhost:1", "a:65535"}
	bad := []string{"10.0.0.1", "fd00::1:8000", "[fd00::1]8000", "[fd00::1", "[10.0.0.1]:80", "a b:80", "http://a:80", "a:65536", "a:-1", "a:"}
	for _, a := range good {
		if _, err := Parse([]byte(`{"endpoints":[{"address":"` + a + `"}]}`)); err != nil {
			t.Errorf("%s rejected: %v", a, err)
		}
	}
	for _, a := range bad {
		if _, err := Parse([]byte(`{"endpoints":[{"address":"` + a + `"}]}`)); err == nil || !strings.Contains(err.Error(), "endpoints[0].address") {
			t.Errorf("%s: error %v, want one naming endpoints[0].address", a, err)
		}
	}
}

func TestModelsAnswer(t *testing.T) {
	for in, want := range map[string]string{``: ModelsAuto, `{"models":{}}`: ModelsAuto, `{"models":{"answer":"local"}}`: ModelsLocal, `{"models":{"answer":"passthrough"}}`: ModelsPassthrough} {
		c, err := Parse([]byte(in))
		if err != nil || c.ModelsAnswer != want {
			t.Errorf("%s: answer %q, %v; want %q", in, c.ModelsAnswer, err, want)
		}
	}
}
