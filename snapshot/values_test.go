package snapshot

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// CheckAddress accepts what Envoy's override_host compares with the
// cluster's endpoints, and says what is wrong with anything else.
func TestCheckAddress(t *testing.T) {
	for _, ok := range []string{"10.0.0.1:8000", "[fd00::1]:8000", "engine-0.engines.svc:8000", "a:1", "a:65535"} {
		if err := CheckAddress(ok); err != nil {
			t.Errorf("CheckAddress(%q) = %v", ok, err)
		}
	}
	for bad, want := range map[string]string{
		"10.0.0.1":        "missing port",
		"[fd00::1":        "missing ']'",
		"[fd00::1]8000":   "missing port",
		"[10.0.0.1]:8000": "brackets are for IPv6 addresses",
		"fd00::1:8000":    "IPv6 addresses need brackets",
		"a b:80":          "characters a host name cannot have",
		":8000":           "has no host",
		"a:0":             "port must be a number from 1 to 65535",
		"a:65536":         "port must be a number from 1 to 65535",
		"a:http":          "port must be a number from 1 to 65535",
		"10.0.0.1:8000|1": "port must be a number",
		"":                "missing port",
	} {
		if err := CheckAddress(bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckAddress(%q) = %v, want an error saying %q", bad, err, want)
		}
	}
}

func TestWholeNumber(t *testing.T) {
	for raw, want := range map[string]int64{"0": 0, "-7": -7, "1e3": 1000, "2.0": 2, "9007199254740993": 9007199254740993, "-0": 0} {
		if n, ok := WholeNumber(gjson.Parse(raw)); !ok || n != want {
			t.Errorf("WholeNumber(%s) = %d, %v; want %d", raw, n, ok, want)
		}
	}
	for _, raw := range []string{"1.5", `"3"`, "true", "null", "1e400", "9223372036854775808", "NaN"} {
		if n, ok := WholeNumber(gjson.Parse(raw)); ok {
			t.Errorf("WholeNumber(%s) = %d, want no whole number", raw, n)
		}
	}
}
