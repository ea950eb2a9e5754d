package filter

import "testing"

func TestHeaderNameIs(t *testing.T) {
	for _, c := range []struct {
		name, lit string
		want      bool
	}{
		{"x-gateway-destination-endpoint", "x-gateway-destination-endpoint", true},
		{"X-Gateway-Destination-Endpoint", "x-gateway-destination-endpoint", true},
		{"X-KVROUTE-", "x-kvroute-", true},
		{"x-kvroute", "x-kvroute-", false},
		{"x-kvroute-x", "x-kvroute-", false},
		{"x-\u212avroute-", "x-kvroute-", false}, // the Kelvin sign folds to k only under Unicode rules
		{"x-kvroutE_", "x-kvroute-", false},
		{"x-kvroute-", "X-KVROUTE-", true},
		{"", "", true},
		{"@", "`", false}, // 0x40 and 0x60 differ by the case bit but are not letters
	} {
		if got := headerNameIs(c.name, c.lit); got != c.want {
			t.Errorf("headerNameIs(%q, %q) = %v, want %v", c.name, c.lit, got, c.want)
		}
	}
}

func TestDecimalAndPathOnly(t *testing.T) {
	for v, want := range map[string]int64{"0": 0, "12": 12, "000123": 123, "999999999999999999": 999999999999999999} {
		if n, ok := decimal(v); !ok || n != want {
			t.Errorf("decimal(%q) = %d, %v; want %d", v, n, ok, want)
		}
	}
	for _, v := range []string{"", "-1", "+1", "1 ", " 1", "0x10", "1e3", "1000000000000000000"} {
		if n, ok := decimal(v); ok {
			t.Errorf("decimal(%q) = %d, want no number", v, n)
		}
	}
	for path, want := range map[string]string{"/v1/completions": "/v1/completions", "/v1/completions?x=1": "/v1/completions",
		"/v1/chat/completions#f": "/v1/chat/completions", "?": "", "": ""} {
		if got := pathOnly(path); got != want {
			t.Errorf("pathOnly(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestIndexBytes(t *testing.T) {
	key := []byte(`"cached_tokens":`)
	for _, c := range []struct {
		b    string
		want int
	}{
		{`{"cached_tokens":5}`, 1},
		{`"cached_tokens"`, -1},
		{`""cached_tokens":`, 1},
		{`xx"cached_token":"cached_tokens":`, 17},
		{``, -1},
	} {
		if got := indexBytes([]byte(c.b), key); got != c.want {
			t.Errorf("indexBytes(%q) = %d, want %d", c.b, got, c.want)
		}
	}
}
