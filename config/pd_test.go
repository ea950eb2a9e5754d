package config

import (
	"strings"
	"testing"
)

func TestPDDefaults(t *testing.T) {
	c, err := Parse([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	want := PD{Protocol: "vllm", PrefillCluster: "kvroute_prefill", DecodeCluster: "kvroute_inference",
		TimeoutMs: 30000, FallbackTimeoutMs: 300000, BootstrapPort: 8998, MarkerHeader: "x-kvroute-pd"}
	if c.PD != want {
		t.Errorf("defaults %+v, want %+v", c.PD, want)
	}
	if e, _ := Parse(nil); e.PD != want {
		t.Errorf("empty configuration: %+v", e.PD)
	}
}

func TestPDParse(t *testing.T) {
	c, err := Parse([]byte(`{"pd":{"protocol":"sglang","prefillCluster":"p","decodeCluster":"d","timeoutMs":250,
		"fallbackTimeoutMs":9000,"bootstrapPort":0,"markerHeader":""}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := PD{Protocol: "sglang", PrefillCluster: "p", DecodeCluster: "d", TimeoutMs: 250, FallbackTimeoutMs: 9000}
	if c.PD != want {
		t.Errorf("got %+v, want %+v", c.PD, want)
	}
}

func TestPDErrors(t *testing.T) {
	for _, tc := range []struct{ cfg, want string }{
		{`{"pd":"vllm"}`, "pd: must be an object"},
		{`{"pd":{"protocol":"nixl"}}`, `pd.protocol: "nixl" is not a protocol`},
		{`{"pd":{"timeoutMs":0}}`, "pd.timeoutMs: must be between 1 and"},
		{`{"pd":{"bootstrapPort":70000}}`, "pd.bootstrapPort: must be between 0 and 65535"},
		{`{"pd":{"prefillCluster":""}}`, "pd.prefillCluster: must not be empty"},
		{`{"pd":{"markerHeader":"X-PD"}}`, "pd.markerHeader: \"X-PD\": header names must be lower case"},
		{`{"pd":{"threshold":512}}`, `pd.threshold: the disaggregation threshold is the router's decision`},
		{`{"pd":{"protcol":"vllm"}}`, "pd.protcol: unknown key"},
	} {
		_, err := Parse([]byte(tc.cfg))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
