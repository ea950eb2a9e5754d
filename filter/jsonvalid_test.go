package filter

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

var jsonCases = []string{
	`{}`, `[]`, `""`, `0`, `-0`, `1.5e-3`, `true`, `false`, `null`, ` {"a" : [1, 2.0, -3e+2, "x\"\\\/\b\f\n\r\t\u00e9", true, false, null, {}, []]} `,
	`{"a":{"b":{"c":[[[]]]}}}`, `[1,[2,[3]]]`, `{"a":1,"b":2}`, "\"\xff\"",
	// invalid
	``, ` `, `{`, `}`, `[`, `]`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[,1]`, `{,}`, `{"a" 1}`, `{a:1}`, `'a'`,
	`01`, `1.`, `.1`, `1e`, `1e+`, `-`, `+1`, `tru`, `nul`, `falsee`, `"abc`, `"\x"`, `"\u12"`, `"\u12g4"`, "\"a\tb\"",
	`{"a":1}{}`, `[1] 2`, `{"a":[1}`, `[{"a":1]}`, `{"a":1,"b"}`, `"\`, `[1 2]`, `{"a":1 "b":2}`, `NaN`, `Infinity`,
	`{"model":"m","prompt":"hel`,
}

func TestValidJSONMatchesEncodingJSON(t *testing.T) {
	for _, c := range jsonCases {
		if got, want := validJSON([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("validJSON(%q) = %v, encoding/json says %v", c, got, want)
		}
	}
	deep := strings.Repeat("[", 5000) + strings.Repeat("]", 5000)
	if !validJSON([]byte(deep)) {
		t.Error("deep nesting refused")
	}
}

// FuzzValidJSON checks validJSON against encoding/json.Valid, the reference.
func FuzzValidJSON(f *testing.F) {
	for _, c := range jsonCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validJSON(b), json.Valid(b); got != want {
			t.Fatalf("validJSON(%q) = %v, encoding/json says %v", b, got, want)
		}
	})
}

// FuzzWalkerMatchesGJSON checks the span walker against gjson on every valid
// document: the same members and elements, in order, with the same raw
// values, and the same string texts.
func FuzzWalkerMatchesGJSON(f *testing.F) {
	for _, c := range jsonCases {
		f.Add([]byte(c))
	}
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"a\"b\\u00e9"}],"x":[1,{"y":[]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if !validJSON(b) {
			return
		}
		i := skipSpace(b, 0)
		v := b[i:skipJSONValue(b, i)]
		compare(t, v, gjson.ParseBytes(v))
	})
}

func compare(t *testing.T, raw []byte, g gjson.Result) {
	t.Helper()
	if string(raw) != g.Raw {
		t.Fatalf("span %q, gjson raw %q", raw, g.Raw)
	}
	switch {
	case g.Type == gjson.String:
		if got := stringOf(raw); got != g.Str {
			t.Fatalf("stringOf(%q) = %q, gjson %q", raw, got, g.Str)
		}
	case g.IsObject():
		var keys, vals [][]byte
		forEachMember(raw, func(k, v []byte) bool { keys, vals = append(keys, k), append(vals, v); return true })
		n := 0
		g.ForEach(func(k, v gjson.Result) bool {
			if n >= len(keys) || string(keys[n]) != k.Raw {
				t.Fatalf("member %d: walker %q, gjson %q", n, keys, k.Raw)
			}
			compare(t, vals[n], v)
			n++
			return true
		})
		if n != len(keys) {
			t.Fatalf("walker found %d members, gjson %d", len(keys), n)
		}
	case g.IsArray():
		var vals [][]byte
		forEachElement(raw, func(v []byte) bool { vals = append(vals, v); return true })
		n := 0
		g.ForEach(func(_, v gjson.Result) bool {
			if n >= len(vals) {
				t.Fatalf("walker found %d elements, gjson more", len(vals))
			}
			compare(t, vals[n], v)
			n++
			return true
		})
		if n != len(vals) {
			t.Fatalf("walker found %d elements, gjson %d", len(vals), n)
		}
	}
}
