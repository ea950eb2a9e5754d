package filter

import (
	"encoding/json"
	"strings"
	"testing"
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
