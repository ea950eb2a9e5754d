package openai

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// FuzzPDRewrite checks the body rewrites on arbitrary input: never a panic;
// for a JSON object, valid JSON out with the protocol's members set, every
// other member kept byte for byte, and kv_transfer_params carried exactly.
// go test -run '^$' -fuzz FuzzPDRewrite ./openai
func FuzzPDRewrite(f *testing.F) {
	for _, seed := range []string{
		`{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"max_completion_tokens":64,"min_tokens":4,"temperature":0.2}`,
		`{"prompt":"p"}`,
		`{}`,
		` {"a":1,"a":2,"stream":true} `,
		`{"kv_transfer_params":{"x":[1,{"y":null}]},"bootstrap_room":5,"stream_options":null}`,
		`{"messages":[{"role":"user","content":"\u00e9\"\\\n"}],"max_completion_tokens":3}`,
		`[1]`, `"s"`, `{"a":`, ``, `null`,
	} {
		f.Add([]byte(seed), []byte(pdBenchKV))
	}
	var reader ObjectReader
	f.Fuzz(func(t *testing.T, body, kv []byte) {
		ms, ok := ParseObject(body)
		// kvroute.pd's reader of client bodies lists the same members
		// while the read budget leaves the body whole.
		if rm, rok := reader.Members(body); !reader.trim.cutBody && (rok != ok || rok && !slices.EqualFunc(rm, ms, func(a, b Member) bool { return a.key == b.key && string(a.raw) == string(b.raw) })) {
			t.Fatalf("%q: the reader says %v %q, ParseObject %v %q", body, rok, rm, ok, ms)
		}
		// validJSON leaves UTF-8 to the router (utf8.Valid): compare on valid text.
		// (An object of more members than the router reads, or nested
		// past its limit, is not rewritten.)
		if utf8.Valid(body) && ok != (gjson.ValidBytes(body) && gjson.ParseBytes(body).IsObject()) &&
			(ok || memberCount(body) <= maxMembers && nesting(gjson.ParseBytes(body)) <= maxNesting) {
			t.Fatalf("ParseObject says %v for %q", ok, body)
		}
		if !ok {
			return
		}
		pb := VLLMPrefillBody(ms)
		bb := WithBootstrap(ms, "10.0.0.1", 8998, 42)
		root := gjson.ParseBytes(body)
		for _, out := range [][]byte{pb, bb} {
			if !gjson.ValidBytes(out) || !gjson.ParseBytes(out).IsObject() {
				t.Fatalf("rewrite is not a JSON object: %q -> %q", body, out)
			}
		}
		p := gjson.ParseBytes(pb)
		if p.Get("stream").Raw != "false" || p.Get("max_tokens").Raw != "1" || p.Get("kv_transfer_params").Raw != VLLMPrefillParams ||
			p.Get("stream_options").Exists() || p.Get("min_tokens").Exists() {
			t.Fatalf("prefill body lacks the protocol's fields: %q", pb)
		}
		// Every member the rewrite does not own survives (last value wins, as
		// in every JSON decoder).
		root.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "stream", "max_tokens", "max_completion_tokens", "kv_transfer_params", "stream_options", "min_tokens":
				return true
			}
			if got := p.Get(gjson.Escape(k.Str)); got.Raw != root.Get(gjson.Escape(k.Str)).Raw {
				t.Fatalf("member %q changed: %q -> %q", k.Str, root.Get(gjson.Escape(k.Str)).Raw, got.Raw)
			}
			return true
		})
		b := gjson.ParseBytes(bb)
		if b.Get("bootstrap_host").String() != "10.0.0.1" || b.Get("bootstrap_port").Raw != "8998" || b.Get("bootstrap_room").Raw != "42" {
			t.Fatalf("bootstrap fields missing: %q", bb)
		}
		// kv as a prefill response carries it, then on into the decode body.
		if !jsonObject(kv) {
			return
		}
		if raw, ok := KVTransferParams([]byte(`{"id":1,"kv_transfer_params":` + string(kv) + `}`)); ok {
			if string(raw) != strings.TrimSpace(string(kv)) {
				t.Fatalf("kv_transfer_params read as %q from %q", raw, kv)
			}
			db := WithKVTransferParams(ms, raw)
			if got := gjson.GetBytes(db, "kv_transfer_params").Raw; got != string(raw) || !gjson.ValidBytes(db) {
				t.Fatalf("kv_transfer_params not carried byte for byte: %q in %q", raw, db)
			}
		}
	})
}

// nesting is how deep the JSON value v nests arrays and objects.
func nesting(v gjson.Result) int {
	if !v.IsObject() && !v.IsArray() {
		return 0
	}
	most := 0
	v.ForEach(func(_, e gjson.Result) bool { most = max(most, nesting(e)); return true })
	return most + 1
}

// memberCount is how many members the JSON object b has, repeated keys
// each.
func memberCount(b []byte) (n int) {
	gjson.ParseBytes(b).ForEach(func(_, _ gjson.Result) bool { n++; return true })
	return n
}
