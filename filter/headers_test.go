package filter

import (
	"encoding/binary"
	"reflect"
	"slices"
	"strings"
	"testing"
)

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

// pick answers as the host would after stripRoutingHeaders: first value,
// any case, and nothing for a header it removes.
func TestRequestHeadersPick(t *testing.T) {
	raw := appendHeaderMap(nil, [][2]string{
		{":path", "/v1/completions"}, {":Method", "POST"}, {"Content-Length", "12"}, {"content-length", "99"},
		{"X-Gateway-Destination-Endpoint", "169.254.169.254:80"}, {"x-kvroute-prefill-host", "10.0.0.9:8000"},
		{"X-Session-Id", ""}, {"x-session-id", "later"}, {"x-kvroute-test-panic", "recover"},
	})
	h := requestHeaders{destination: "x-gateway-destination-endpoint", session: "x-session-id"}
	if err := h.pick(raw); err != nil {
		t.Fatal(err)
	}
	want := requestHeaders{destination: h.destination, session: h.session, read: true,
		path: "/v1/completions", method: "POST", contentLength: "12", testHook: "recover",
		remove: []string{"x-gateway-destination-endpoint", "x-kvroute-prefill-host", "x-kvroute-test-panic"}}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("picked %+v, want %+v", h, want)
	}
	// A configured header that is also an internal one (the shipped
	// x-kvroute-prefix-key) is read, then removed.
	h = requestHeaders{destination: "x-gateway-destination-endpoint", session: "x-kvroute-prefill-host", prefixKeyName: "X-Kvroute-Test-Panic", extra: true}
	if err := h.pick(raw); err != nil || h.sessionKey != "10.0.0.9:8000" || h.prefixKey != "recover" || !slices.Contains(h.remove, "x-kvroute-prefill-host") {
		t.Errorf("session key %q, prefix key %q, removed %q (%v), want both read and removed", h.sessionKey, h.prefixKey, h.remove, err)
	}
	// No session header configured: a header without a name is not it.
	h = requestHeaders{destination: "x-gateway-destination-endpoint"}
	if err := h.pick(appendHeaderMap(nil, [][2]string{{"", "v"}})); err != nil || h.sessionKey != "" || h.remove != nil {
		t.Errorf("session key %q, remove %q (%v), want none", h.sessionKey, h.remove, err)
	}
}

// pick reads every map appendHeaderMap writes, and refuses a map that ends
// before its count says.
func TestHeaderMapRoundTrip(t *testing.T) {
	long := strings.Repeat("v", 300)
	for _, pairs := range [][][2]string{
		{},
		{{":path", ""}},
		{{":path", "/v1/chat/completions"}, {"a", ""}, {":method", "POST"}, {"content-length", long}, {"x-session-id", "s"}},
	} {
		raw := appendHeaderMap(nil, pairs)
		h := requestHeaders{session: "x-session-id"}
		if err := h.pick(raw); err != nil {
			t.Fatalf("%q: %v", pairs, err)
		}
		var want requestHeaders
		for _, kv := range pairs {
			switch kv[0] {
			case ":path":
				want.path = kv[1]
			case ":method":
				want.method = kv[1]
			case "content-length":
				want.contentLength = kv[1]
			case "x-session-id":
				want.sessionKey = kv[1]
			}
		}
		if got := [...]string{h.path, h.method, h.contentLength, h.sessionKey}; got != [...]string{want.path, want.method, want.contentLength, want.sessionKey} {
			t.Errorf("%q: picked %q", pairs, got)
		}
		for cut := 0; cut < len(raw); cut++ {
			if err := (&requestHeaders{}).pick(raw[:cut]); err == nil {
				t.Errorf("%q cut to %d bytes: no error", pairs, cut)
			}
		}
	}
	huge := binary.LittleEndian.AppendUint32(nil, 1<<31)
	if err := (&requestHeaders{}).pick(huge); err == nil {
		t.Error("a count beyond the map: no error")
	}
}
