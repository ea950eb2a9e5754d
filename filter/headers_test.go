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
