package openai

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// scrub removes every top-level gateway-only member however its key is
// spelled, keeps every other member as it was, and keeps the body's length.
func TestScrubRemovesGatewayOnlyMembers(t *testing.T) {
	p := newParser(t, `{}`)
	for _, tc := range []struct {
		in, want string // want "" : unchanged
		ok       bool
	}{
		{`{"model":"m","prompt":"x"}`, "", true},
		{`{"model":"m","kv_transfer_params":{"a":1},"prompt":"x"}`, `{"model":"m","prompt":"x"}`, true},
		{`{"kv_transfer_param\u0073":1,"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":2}`, `{}`, true},
		{` {"bootstrap_room":1,"bootstrap_room":2,"x":{"kv_transfer_params":1}}`, `{"x":{"kv_transfer_params":1}}`, true},
		{`{"a":NaN}`, "", true},
		{`{"kv_transfer_params":NaN}`, "", false},
		{`{"a":"\u0000", "b":NaN}`, "", false},
		{`[{"kv_transfer_params":1}]`, "", true}, // not an object: no engine reads its fields
	} {
		clean, ok := p.Scrub([]byte(tc.in))
		if ok != tc.ok {
			t.Errorf("%s: ok %v, want %v", tc.in, ok, tc.ok)
			continue
		}
		if tc.want == "" {
			if clean != nil {
				t.Errorf("%s: changed to %q", tc.in, clean)
			}
			continue
		}
		if len(clean) != len(tc.in) || strings.TrimRight(string(clean), " ") != tc.want {
			t.Errorf("%s: %q, want %q padded to %d bytes", tc.in, clean, tc.want, len(tc.in))
		}
	}
}

// FuzzScrub: whatever the body, a scrubbed one is valid JSON of the same
// length that no gateway-only key survives in at the top level, and a body
// left unchanged as safe is either not a valid JSON object with such a key,
// or cannot spell one.
func FuzzScrub(f *testing.F) {
	for _, s := range []string{`{"model":"m","kv_transfer_params":{}}`, `{"bootstrap_h\u006fst":1}`, `{"a":1}`, `{`, `{"kv_transfer_params":NaN}`, "\xef\xbb\xbf{}"} {
		f.Add([]byte(s))
	}
	p := newParser(f, `{}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		clean, ok := p.Scrub(body)
		switch {
		case clean != nil:
			if !ok || len(clean) != len(body) || !gjson.ValidBytes(clean) {
				t.Fatalf("scrub(%q) = %q, %v", body, clean, ok)
			}
			gjson.ParseBytes(clean).ForEach(func(k, _ gjson.Result) bool {
				if fieldOf(k.String(), requestFields[:]) >= firstClientOnly {
					t.Fatalf("scrub(%q) kept %q", body, k.String())
				}
				return true
			})
		case ok && gjson.ValidBytes(body) && gjson.ParseBytes(body).IsObject():
			gjson.ParseBytes(body).ForEach(func(k, _ gjson.Result) bool {
				if fieldOf(k.String(), requestFields[:]) >= firstClientOnly {
					t.Fatalf("scrub(%q) let %q through", body, k.String())
				}
				return true
			})
		}
	})
}

// MayHoldClientOnly's word-at-a-time scan finds what a byte-by-byte one
// finds, wherever in a word the byte falls.
func TestMayHoldClientOnlyAtEveryOffset(t *testing.T) {
	for _, needle := range []string{"kv_", "bootstrap_", `\u`, "\x00"} {
		for off := 0; off < 20; off++ {
			body := strings.Repeat("a", off) + needle + strings.Repeat("b", 17)
			if !MayHoldClientOnly([]byte(body)) {
				t.Errorf("%q at %d not found", needle, off)
			}
		}
	}
	for _, clean := range []string{"", "a_b", "k_v", "bootstra_", `\n\t\\`, strings.Repeat("abc_def\\n", 9)} {
		if MayHoldClientOnly([]byte(clean)) {
			t.Errorf("%q flagged", clean)
		}
	}
}
