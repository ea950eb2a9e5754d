package filter

import (
	"bytes"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/snapshot"
)

func newParser(t testing.TB, cfgJSON string) *requestParser {
	cfg, err := config.Parse([]byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	return &requestParser{cfg: cfg, hasher: index.NewHasher(index.HashConfig{})}
}

func TestParseFields(t *testing.T) {
	p := newParser(t, `{"loraAdapters":{"sql-lora":"llama-3-8b"}}`)
	r, err := p.parse([]byte(`{"model":"sql-lora","prompt":"`+strings.Repeat("x", 4000)+`","stream":true,"max_tokens":64,"user":"alice"}`), apiCompletions)
	if err != nil {
		t.Fatal(err.Message)
	}
	if r.Model != "llama-3-8b" || r.Adapter != "sql-lora" || !r.Stream || r.MaxTokens != 64 || r.SessionKey != "alice" || r.PromptTokens != 1000 {
		t.Errorf("parsed %+v", r)
	}
	if len(p.hasher.Blocks()) == 0 {
		t.Error("no blocks hashed")
	}
	r, err = p.parse([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":9}`), apiUnknown)
	if err != nil || r.MaxTokens != 9 {
		t.Errorf("sniffed chat: %+v %v", r, err)
	}
}

// TestParseStreamUsage checks when a request asks for usage in its stream
// (stream_options), which decides whether the router reads the streamed
// response's chunks.
func TestParseStreamUsage(t *testing.T) {
	p := newParser(t, `{}`)
	for _, tc := range []struct {
		fields string
		want   bool
	}{
		{`"stream":true`, false},
		{`"stream":true,"stream_options":{"include_usage":true}`, true},
		{`"stream":true,"stream_options":{"include_usage":false}`, false},
		{`"stream":true,"stream_options":{"continuous_usage_stats":true}`, false}, // ContinuousUsage: probed
		{`"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true}`, true},
		{`"stream":true,"stream_options":{"include\u005fusage":true}`, true},       // the key as the engine decodes it
		{`"stream":true,"stream_options":{"include_usage":"true"}`, false},         // not a boolean: the engine's to reject
		{`"stream":true,"stream_options":{"other":{"include_usage":true}}`, false}, // not a member of stream_options
		{`"stream":true,"stream_options":null`, false},
		{`"stream":false,"stream_options":{"include_usage":true}`, false}, // not a stream
		{`"stream_options":{"include_usage":true},"stream":true`, true},
	} {
		r, err := p.parse([]byte(`{"model":"m","prompt":"hello",`+tc.fields+`}`), apiCompletions)
		if err != nil {
			t.Errorf("%s: %s", tc.fields, err.Message)
			continue
		}
		if r.StreamUsage != tc.want {
			t.Errorf("%s: StreamUsage %v, want %v", tc.fields, r.StreamUsage, tc.want)
		}
		if want := strings.Contains(tc.fields, `"continuous_usage_stats":true`) && !tc.want; r.ContinuousUsage != want {
			t.Errorf("%s: ContinuousUsage %v, want %v", tc.fields, r.ContinuousUsage, want)
		}
	}
}

// Same prefix, same leading blocks; a different model or salt, different blocks.
func TestParseHashesPrefixes(t *testing.T) {
	p := newParser(t, `{}`)
	sys := strings.Repeat("shared system prompt ", 100)
	chain := func(body string, kind apiKind) []uint64 {
		if _, err := p.parse([]byte(body), kind); err != nil {
			t.Fatal(err.Message)
		}
		return append([]uint64(nil), p.hasher.Blocks()...)
	}
	a := chain(chatBody(sys, "one"), apiChat)
	b := chain(chatBody(sys, "two"), apiChat)
	if len(a) < 4 || a[0] != b[0] || a[3] != b[3] {
		t.Errorf("shared prefix does not share leading blocks: %x vs %x", a[:4], b[:4])
	}
	c := chain(strings.Replace(chatBody(sys, "one"), `"llama-3-8b"`, `"other"`, 1), apiChat)
	if c[0] == a[0] {
		t.Error("another model shares block hashes")
	}
}

func TestErrorBodyIsOpenAIStyle(t *testing.T) {
	e := badRequest("messages[0].role", "'%s' must be a non-empty string", "messages[0].role")
	b := string(e.body())
	if !gjson.Valid(b) || gjson.Get(b, "error.type").String() != "invalid_request_error" ||
		gjson.Get(b, "error.param").String() != "messages[0].role" || gjson.Get(b, "error.code").Int() != 400 {
		t.Errorf("body %s", b)
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, tc := range badInputs {
		f.Add([]byte(tc.body), uint8(kindOf(tc.path)))
	}
	f.Add([]byte(`{"model":"m","prompt":[[1,2],[3]]}`), uint8(apiCompletions))
	f.Add([]byte(`{"model":"m","input":"x"}`), uint8(apiUnknown))
	p := newParser(f, `{"loraAdapters":{"a":"b"}}`)
	f.Fuzz(func(t *testing.T, body []byte, kind uint8) {
		r, err := p.parse(body, apiKind(kind%4))
		if err != nil {
			if err.Status != 400 || err.Message == "" || !gjson.ValidBytes(err.body()) {
				t.Fatalf("bad error %+v", err)
			}
			return
		}
		if r.Model == "" || r.MaxTokens < 0 || r.PromptTokens < 0 {
			t.Fatalf("accepted request breaks invariants: %+v", r)
		}
	})
}

func TestDecodeSnapshot(t *testing.T) {
	st, err := decodeSnapshot([]byte(`{"version":1,"timestampMs":5,"source":"svc","hosts":[{"address":"10.0.0.1:8000","role":"prefill","model":"m","adapters":["a"],"healthy":false,"waiting":3,"running":2,"kvUsage":0.5,"blockSize":16,"numGpuBlocks":1000}]}`))
	if err != nil {
		t.Fatal(err)
	}
	h := st.Hosts[0]
	if st.TimestampMs != 5 || h.Role != "prefill" || h.Healthy || h.Waiting != 3 || h.Running != 2 || h.KVUsage != 0.5 || h.NumGPUBlocks != 1000 || len(h.Adapters) != 1 {
		t.Errorf("decoded %+v", st)
	}
	for body, want := range map[string]string{
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"},{"address":"a:1"}]}`:                                                          "appears twice",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","kvUsage":2}]}`:                                                                "hosts[0].kvUsage",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","waiting":-1}]}`:                                                               "hosts[0].waiting",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","role":"leader"}]}`:                                                            "hosts[0].role",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","healthy":"yes"}]}`:                                                            "hosts[0].healthy",
		`{"version":1,"timestampMs":-5,"hosts":[{"address":"a:1"}]}`:                                                                           "timestampMs",
		`{"version":1,"timestampMs":5,"hosts":{}}`:                                                                                             "hosts: must be an array",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","adapters":[1]}]}`:                                                             "hosts[0].adapters",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a"}]}`:                                                                              "hosts[0].address",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"gateways":{}}`:                                                              "gateways: must be an array",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"gateways":[{"gateway":""}]}`:                                                "gateways[0].gateway",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"gateways":[{"gateway":"g","routes":[{"address":"a:1","chain":"AQID"}]}]}`:   "gateways[0].routes[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"gateways":[{"gateway":"g","load":[{"address":"a:1","inFlight":-1}]}]}`:      "gateways[0].load[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":{}}`:                                                              "removals: must be an array",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","from":0,"chain":"AQID"}]}`:                     "removals[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","from":2,"chain":"AQAAAAAAAAACAAAAAAAAAA=="}]}`: "removals[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","chain":"AQAAAAAAAAACAAAAAAAAAA=="}]}`:          "removals[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a","from":0,"chain":"AQAAAAAAAAA="}]}`:               "removals[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","from":-1,"chain":"AQAAAAAAAAA="}]}`:            "removals[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","from":0.5,"chain":"AQAAAAAAAAA="}]}`:           "removals[0]",
		`{"version":2,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","from":0,"chain":"AQAAAAAAAAA="}]}`:             "version",
		`not json`: "not valid JSON",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","dataParallelSize":2,"rank":2}]}`:                                                 "hosts[0].rank: 2 is not a rank of the endpoint's 2 data-parallel ranks (0 to 1",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","rank":1}]}`:                                                                      "hosts[0].rank: 1 is not a rank of the endpoint's 1",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","dataParallelSize":0}]}`:                                                          "hosts[0].dataParallelSize",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","dataParallelSize":2,"rank":-1}]}`:                                                "hosts[0].rank",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","dataParallelSize":2,"rank":1},{"address":"a:1","dataParallelSize":2,"rank":1}]}`: "appears twice",
	} {
		if _, err := decodeSnapshot([]byte(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", body, err, want)
		}
	}
}

// Each rank of a data-parallel endpoint is a host entry of its own.
func TestDecodeSnapshotRanks(t *testing.T) {
	// Another gateway's routes name a rank as host:port|rank.
	if _, err := decodeSnapshot([]byte(`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"gateways":[{"gateway":"g","timestampMs":5,"routes":[{"address":"a:1|1","from":0,"chain":"AQAAAAAAAAA="}]}]}`)); err != nil {
		t.Errorf("a route to a rank: %v", err)
	}
	if _, err := decodeSnapshot([]byte(`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"gateways":[{"gateway":"g","timestampMs":5,"routes":[{"address":"a:1|x","from":0,"chain":"AQAAAAAAAAA="}]}]}`)); err == nil {
		t.Errorf("a route to rank x accepted")
	}
	st, err := decodeSnapshot([]byte(`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","dataParallelSize":2,"rank":0,"waiting":4},{"address":"a:1","dataParallelSize":2,"rank":1,"waiting":0}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Hosts) != 2 || st.Hosts[1].Rank != 1 || st.Hosts[1].DataParallelSize != 2 || st.Hosts[0].Waiting != 4 {
		t.Errorf("decoded %+v", st.Hosts)
	}
}

// A valid removal decodes as sent; a snapshot without one has none.
func TestDecodeRemovals(t *testing.T) {
	st, err := decodeSnapshot([]byte(`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","from":1,"chain":"AQAAAAAAAAACAAAAAAAAAA=="}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Removals) != 1 || st.Removals[0] != (snapshot.Removal{Address: "a:1", From: 1, Chain: "AQAAAAAAAAACAAAAAAAAAA=="}) {
		t.Fatalf("removals %+v", st.Removals)
	}
	if st, err := decodeSnapshot([]byte(`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":null}`)); err != nil || st.Removals != nil {
		t.Fatalf("null removals: %+v %v", st.Removals, err)
	}
}

func FuzzDecodeSnapshot(f *testing.F) {
	f.Add([]byte(pushBody(1, "10.0.0.1:8000", "10.0.0.2:8000")))
	f.Add([]byte(`{"version":1,"timestampMs":1,"hosts":[{"address":"[::1]:1","kvUsage":1}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		st, err := decodeSnapshot(body)
		if err != nil {
			return
		}
		if len(st.Hosts) == 0 || st.TimestampMs <= 0 {
			t.Fatalf("accepted %+v", st)
		}
		for _, h := range st.Hosts {
			if config.CheckAddress(h.Address) != nil || h.KVUsage < 0 || h.KVUsage > 1 {
				t.Fatalf("accepted host %+v", h)
			}
		}
	})
}

func TestBearer(t *testing.T) {
	for header, want := range map[string]bool{
		"Bearer tok": true, "bearer tok": true, "  Bearer   tok ": true,
		"Bearer tok2": false, "Bearer": false, "Bearer ": false, "Basic tok": false, "tok": false, "": false,
	} {
		if got := authorized(header, "tok"); got != want {
			t.Errorf("authorized(%q) = %v, want %v", header, got, want)
		}
	}
	if authorized("Bearer ", "") || authorized("Bearer x", "") {
		t.Error("an empty configured token must authorize nothing")
	}
}

func TestParseORCA(t *testing.T) {
	l := parseORCA("TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=2.0, cpu_utilization=0.3")
	if !l.ok || l.KVUsage != 0.4 || l.Waiting != 2 {
		t.Errorf("text: %+v", l)
	}
	l = parseORCA(`JSON {"named_metrics":{"kv_cache_usage_perc":0.9,"num_requests_running":7}}`)
	if !l.ok || l.KVUsage != 0.9 || l.Running != 7 {
		t.Errorf("json: %+v", l)
	}
	for _, bad := range []string{"", "TEXT", "TEXT named_metrics.kv_cache_usage_perc=abc", "JSON {", "TEXT named_metrics.kv_cache_usage_perc=7", "BINARY x"} {
		if l := parseORCA(bad); l.ok {
			t.Errorf("%q parsed as %+v", bad, l)
		}
	}
}

func TestCachedTokensAcrossChunks(t *testing.T) {
	if n, ok := cachedTokens(nil, []byte(`{"usage":{"prompt_tokens_details":{"cached_tokens": 96}}}`)); !ok || n != 96 {
		t.Errorf("whole: %d %v", n, ok)
	}
	first := []byte(`data: {"usage":{"prompt_tokens_details":{"cached_tok`)
	second := []byte(`ens":128}}}` + "\n\n")
	if _, ok := cachedTokens(nil, first); ok {
		t.Error("found a value in half a field")
	}
	var tail tailBuf
	tail.keep(first)
	if n, ok := cachedTokens(tail.bytes(), second); !ok || n != 128 {
		t.Errorf("split: %d %v", n, ok)
	}
	// A long chunk leaves only its end; a split field is still found.
	long := append(bytes.Repeat([]byte("x"), 3*tailKeep), first...)
	tail.keep(long)
	if got := string(tail.bytes()); got != string(long[len(long)-tailKeep:]) {
		t.Errorf("tail kept %q, want the chunk's last %d bytes", got, tailKeep)
	}
	if n, ok := cachedTokens(tail.bytes(), second); !ok || n != 128 {
		t.Errorf("split after a long chunk: %d %v", n, ok)
	}
	// A number cut at the chunk end is not taken until it is complete.
	if _, ok := cachedTokens(nil, []byte(`"cached_tokens":12`)); ok {
		t.Error("took a number that may continue in the next chunk")
	}
}

func TestBreakerUnit(t *testing.T) {
	b := newBreakers(config.CircuitBreaker{ConsecutiveFailures: 3, CooldownMs: 100})
	for i := 0; i < 2; i++ {
		b.result("a", false, 0)
	}
	b.result("a", true, 0) // a success resets the count
	for i := 0; i < 2; i++ {
		if b.result("a", false, 0) {
			t.Fatal("opened before 3 consecutive failures")
		}
	}
	if !b.result("a", false, 10) || !b.open("a", 50) {
		t.Fatal("3 consecutive failures must open")
	}
	if b.open("a", 110) { // cool-down over: half-open, one probe allowed
		t.Fatal("no probe after the cool-down")
	}
	b.dispatched("a", 110)
	if !b.open("a", 111) {
		t.Fatal("a second request while the probe is in flight")
	}
	b.abandoned("a") // the probe's client went away
	if b.open("a", 112) {
		t.Fatal("an abandoned probe must let the next request probe")
	}
	b.dispatched("a", 112)
	b.result("a", true, 120)
	if b.open("a", 121) {
		t.Fatal("a successful probe must close the breaker")
	}
}

// Keys count as the engine's JSON decoder reads them: an escaped
// kv_transfer_params is still removed, an escaped "model" is still the model.
func TestEscapedKeysCountAsDecoded(t *testing.T) {
	p := newParser(t, `{}`)
	body := []byte(`{"mod\u0065l":"m","kv_transfer_p\u0061rams":{"remote_host":"169.254.169.254"},"prompt":"hi"}`)
	r, err := p.parse(body, apiCompletions)
	if err != nil {
		t.Fatal(err.Message)
	}
	if r.Model != "m" {
		t.Errorf("model %q, want m", r.Model)
	}
	clean := p.withoutClientOnly(body)
	if p.dropped != 1 || strings.Contains(string(clean), "169.254") || gjson.GetBytes(clean, "prompt").Str != "hi" {
		t.Errorf("dropped %d, forwarded %s", p.dropped, clean)
	}
}

// withoutClientOnly walks the members again after parse (which only counts
// the client-only ones): the body it forwards is the accepted body's other
// members, byte for byte and in order, wherever the dropped ones were and
// however long the values around them (long ones are in the span table,
// which the chat walk has gone past).
func TestWithoutClientOnlyKeepsTheOtherMembers(t *testing.T) {
	long := strings.Repeat("a long system prompt ", 20)
	keep := []string{
		`"model" : "m"`,
		`"messages":[ {"role":"system","content":"` + long + `"}, {"role":"user","content":"hi"} ]`,
		`"stream":true`,
		`"metadata":{"note":"` + long + `","n":[1,2,3]}`,
	}
	drop := []string{
		`"kv_transfer_params":{"remote_host":"169.254.169.254","blob":"` + long + `"}`,
		`"bootstrap_host" :"10.0.0.1"`,
		`"bootstrap_p\u006frt": 8998`,
		`"bootstrap_room":7`,
	}
	for _, order := range [][]string{
		{drop[0], keep[0], keep[1], drop[1], keep[2], drop[2], keep[3], drop[3]},
		{keep[0], drop[1], drop[0], keep[1], keep[2], keep[3]},
		{keep[0], keep[1], keep[2], keep[3], drop[3]},
	} {
		body := "{ " + strings.Join(order, " ,\n ") + " }"
		var want []string
		dropped := 0
		for _, m := range order {
			if slices.Contains(drop, m) {
				dropped++
			} else {
				want = append(want, m)
			}
		}
		p := newParser(t, `{}`)
		if _, err := p.parse([]byte(body), apiChat); err != nil {
			t.Fatalf("%s: %s", body, err.Message)
		}
		got := p.withoutClientOnly([]byte(body))
		if p.dropped != dropped || string(got) != "{"+strings.Join(want, ",")+"}" {
			t.Errorf("%s:\ndropped %d, forwarded %s", body, p.dropped, got)
		}
	}
	p := newParser(t, `{}`)
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	if _, err := p.parse(body, apiChat); err != nil || p.withoutClientOnly(body) != nil {
		t.Errorf("a body without client-only members: err %v, forwarded %s", err, p.withoutClientOnly(body))
	}
}

// rawWholeNumber reads what wholeNumber reads from gjson, for every kind of
// JSON number, with or without its fast path.
func TestRawWholeNumberMatchesGJSON(t *testing.T) {
	for _, v := range []string{
		"0", "-0", "4", "-1", "10", "4096", "123456789012345678", "-123456789012345678",
		"1234567890123456789", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
		"-9223372036854775809", "99999999999999999999", "1e3", "1E3", "2.0", "2.5", "-2.0", "1.5e300", "0.0", "1e-3",
	} {
		n, ok := rawWholeNumber([]byte(v))
		wn, wok := wholeNumber(gjson.Parse(v))
		if n != wn || ok != wok {
			t.Errorf("rawWholeNumber(%s) = %d, %v; wholeNumber = %d, %v", v, n, ok, wn, wok)
		}
	}
}

// The parser's fast paths (the span table, strings hashed straight from the
// body when they hold no escape, the word-at-a-time string scan, whole
// blocks hashed without the digest, plain integers read without gjson) must
// hash every body as a plain reading of it with gjson does: strings with
// and without escapes, raw and escaped non-ASCII text, surrogate pairs,
// strings short and long (shorter and longer than a span table entry and
// than a block, many blocks long), content parts, completions prompts as
// strings, arrays of strings and token ids, and whitespace between tokens.
func TestParseMatchesGJSONReading(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	pieces := []string{
		"a", "word ", "The quick brown fox. ", `\n`, `\"`, `\\`, `\/`, `\t`, `\u00e9`, `\u4e2d`, `\ud83d\ude00`,
		"é", "中文", "🙂", "\u007f", "~", "{", "}", "[", "]", ":", ",",
	}
	str := func() string {
		var n int
		switch rng.Intn(4) {
		case 0:
			n = rng.Intn(4)
		case 1:
			n = rng.Intn(40)
		case 2:
			n = rng.Intn(400)
		default:
			n = rng.Intn(12000)
		}
		n = max(n, 2)             // one character at least: empty prompts and roles are errors
		plain := rng.Intn(2) == 0 // half the strings have no escape and no non-ASCII
		var sb strings.Builder
		sb.WriteByte('"')
		for sb.Len() < n {
			if plain {
				sb.WriteString(pieces[rng.Intn(3)])
			} else {
				sb.WriteString(pieces[rng.Intn(len(pieces))])
			}
		}
		sb.WriteByte('"')
		return sb.String()
	}
	ws := func() string { return []string{"", " ", "\n  ", "\t"}[rng.Intn(4)] }
	ref := index.NewHasher(index.HashConfig{})
	p := newParser(t, `{}`)
	for trial := 0; trial < 400; trial++ {
		var body strings.Builder
		model := []string{`"llama-3-8b"`, `"m\u00e9"`, `"mod\"el"`}[rng.Intn(3)]
		body.WriteString("{" + ws() + `"model"` + ws() + ":" + ws() + model + ws())
		kind := apiChat
		tokens := false
		switch rng.Intn(7) {
		case 5:
			// Batches of token ids, many and small (the parser gathers
			// them across arrays) or few and long.
			kind, tokens = apiCompletions, true
			body.WriteString(`,"prompt":[` + ws())
			long := rng.Intn(2) == 0
			for i, n := 0, 1+rng.Intn(600); i < n; i++ {
				if i > 0 {
					body.WriteString("," + ws())
				}
				body.WriteString("[" + ws())
				for j, m := 0, 1+rng.Intn(3); j < m || long && j < 1+rng.Intn(700); j++ {
					if j > 0 {
						body.WriteString([]string{",", ", ", " ,"}[rng.Intn(3)])
					}
					fmt.Fprint(&body, []string{"7", "0", "4294967295", "2.0", "123456789", "1234567890"}[rng.Intn(6)])
				}
				body.WriteString(ws() + "]")
			}
			body.WriteString(ws() + "]")
		case 6:
			// Many short strings, empty ones included, and now and then
			// a long one: the parser gathers them across elements.
			kind = apiCompletions
			body.WriteString(`,"prompt":[`)
			for i, n := 0, 1+rng.Intn(3000); i < n; i++ {
				if i > 0 {
					body.WriteString("," + ws())
				}
				switch rng.Intn(20) {
				case 0:
					body.WriteString(`""`)
				case 1:
					body.WriteString(str())
				default:
					body.WriteString([]string{`"a"`, `"ab"`, `"\n"`, `"x\"y"`, `"1234567"`, `"12345678"`, `"é"`}[rng.Intn(7)])
				}
			}
			body.WriteString("]")
		case 4:
			// Token ids: plain, zero, the largest, whole-valued floats,
			// with and without spaces around the commas.
			kind, tokens = apiCompletions, true
			body.WriteString(`,"prompt":[` + ws())
			for i, n := 0, 1+rng.Intn(3000); i < n; i++ {
				if i > 0 {
					body.WriteString([]string{",", ",", ", ", " ,\n", ","}[rng.Intn(5)])
				}
				switch rng.Intn(12) {
				case 0:
					body.WriteString("0")
				case 1:
					body.WriteString("4294967295")
				case 2:
					body.WriteString("7.0")
				case 3:
					body.WriteString("1e3")
				default:
					fmt.Fprint(&body, rng.Intn(1<<uint(1+rng.Intn(31))))
				}
			}
			body.WriteString(ws() + "]")
		case 0:
			kind = apiCompletions
			body.WriteString(`,"prompt":` + ws() + str())
		case 1:
			kind = apiCompletions
			body.WriteString(`,"prompt":[`)
			for i, n := 0, 1+rng.Intn(3); i < n; i++ {
				if i > 0 {
					body.WriteString("," + ws())
				}
				body.WriteString(str())
			}
			body.WriteString("]")
		default:
			body.WriteString(`,"messages":` + ws() + "[")
			for i, n := 0, 1+rng.Intn(4); i < n; i++ {
				if i > 0 {
					body.WriteString("," + ws())
				}
				body.WriteString(`{"role":` + str() + "," + ws())
				if rng.Intn(3) == 0 {
					body.WriteString(`"content":[{"type":"text","text":` + str() + `},` + ws() + `{"text":` + str() + `,"type":"text"}]}`)
				} else {
					body.WriteString(`"content":` + ws() + str() + ws() + "}")
				}
			}
			body.WriteString("]")
		}
		if rng.Intn(2) == 0 {
			body.WriteString(`,"max_tokens":` + []string{"4", "4096", "2.0", "1e3", "0"}[rng.Intn(5)])
		}
		body.WriteString(ws() + "}")
		b := []byte(body.String())
		if !gjson.ValidBytes(b) {
			t.Fatalf("test body is not JSON: %s", b)
		}

		r, perr := p.parse(b, kind)
		if perr != nil {
			t.Fatalf("trial %d: %s\n%.300s", trial, perr.Message, b)
		}
		// The same with gjson alone.
		doc := gjson.ParseBytes(b)
		ref.Reset(doc.Get("model").String(), "", "")
		if kind == apiChat {
			for _, m := range doc.Get("messages").Array() {
				ref.BeginMessage(m.Get("role").String())
				if c := m.Get("content"); c.IsArray() {
					for _, part := range c.Array() {
						ref.Text(part.Get("text").String())
					}
				} else {
					ref.Text(c.String())
				}
			}
		} else if pr := doc.Get("prompt"); tokens {
			for _, e := range pr.Array() {
				if e.IsArray() {
					for _, id := range e.Array() {
						ref.Token(uint32(id.Num))
					}
				} else {
					ref.Token(uint32(e.Num))
				}
			}
		} else if pr.IsArray() {
			for _, e := range pr.Array() {
				ref.Text(e.String())
			}
		} else {
			ref.Text(pr.String())
		}
		if !slices.Equal(p.hasher.Blocks(), ref.Blocks()) || r.PromptTokens != ref.PromptTokens() || r.Model != doc.Get("model").String() {
			t.Fatalf("trial %d: parse hashed %d blocks (%d tokens, model %q), gjson reading %d (%d tokens)\n%.300s",
				trial, len(p.hasher.Blocks()), r.PromptTokens, r.Model, len(ref.Blocks()), ref.PromptTokens(), b)
		}
		if mt := doc.Get("max_tokens"); mt.Exists() && int64(r.MaxTokens) != int64(mt.Num) {
			t.Fatalf("trial %d: max_tokens %d, gjson %v", trial, r.MaxTokens, mt.Num)
		}
	}
}

// FuzzPromptMatchesGJSONReading checks that a completions prompt the parser
// accepts hashes as a plain reading of it with gjson does, one hasher call
// per string or token id: the parser gathers the elements of prompt arrays
// into batches, which must hash exactly as the pieces.
func FuzzPromptMatchesGJSONReading(f *testing.F) {
	for _, s := range bodyShapes {
		if kindOf(s.path) == apiCompletions {
			f.Add([]byte(s.body(300, 1)))
		}
	}
	f.Add([]byte(`{"model":"m","prompt":[[1, 2 ,3],[4.0],[5e0,4294967295]]}`))
	f.Add([]byte(`{"model":"m","prompt":["", "a\nb", "\u00e9", ""],"cache_salt":"s"}`))
	f.Add([]byte(`{"model":"m","prompt":[7,8,9],"prompt":"last wins"}`))
	p := newParser(f, `{}`)
	ref := index.NewHasher(index.HashConfig{})
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := p.parse(body, apiCompletions)
		if err != nil {
			return
		}
		// The last of repeated members counts, as in the parser.
		var prompt, salt gjson.Result
		gjson.ParseBytes(body).ForEach(func(k, v gjson.Result) bool {
			switch k.String() {
			case "prompt":
				prompt = v
			case "cache_salt":
				salt = v
			}
			return true
		})
		ref.Reset(r.Model, r.Adapter, salt.String())
		if !prompt.IsArray() {
			ref.Text(prompt.String())
			prompt = gjson.Result{}
		}
		for _, e := range prompt.Array() {
			switch {
			case e.Type == gjson.String:
				ref.Text(e.String())
			case e.IsArray():
				for _, id := range e.Array() {
					ref.Token(uint32(id.Num))
				}
			default:
				ref.Token(uint32(e.Num))
			}
		}
		if !slices.Equal(p.hasher.Blocks(), ref.Blocks()) || r.PromptTokens != ref.PromptTokens() {
			t.Fatalf("parse hashed %d blocks (%d tokens), gjson reading %d (%d tokens)", len(p.hasher.Blocks()), r.PromptTokens, len(ref.Blocks()), ref.PromptTokens())
		}
	})
}

// Tool calls and image and audio parts are read in place (gjson on views of
// the body) and hash as a reading of the whole body with gjson does.
func TestParseToolCallsAndPartsMatchGJSONReading(t *testing.T) {
	p := newParser(t, `{}`)
	ref := index.NewHasher(index.HashConfig{})
	for _, calls := range []string{
		`[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]`,
		`[{"id":"c1","function":{"name":"f","arguments":"{}"}},{"id":7,"function":{"name":"g\u00e9","arguments":{"raw":true}}}]`,
		`[{"function":{"name":"f"}}, 3, "x", null, {"id":"c2"}, []]`,
		`[{"id":"first","id":"second","function":{"name":1e3,"arguments":[1,{"a":"\n"}],"name":"late"}},{"\u0069d":"escaped key","function":"not an object"}]`,
		`[{"id":"c","function":{"name":"` + strings.Repeat("n", 70) + `","arguments":"` + strings.Repeat(`{\"k\":\"v\"}`, 9) + `"},"` + strings.Repeat("k", 70) + `":0}]`,
		`[{"id":-0.5,"function":{"name":true,"arguments":null}},{"id":12345678901234567890}]`,
		`[{"\u0069d":"escaped first","id":"plain","function":{"n\u0061me":"escaped name","name":"plain name","arguments":"a","arguments":"b"},"function":{"name":"second function"}}]`,
		`[]`,
	} {
		for _, parts := range []string{
			`[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}}]`,
			`[{"type":"input_audio","input_audio":{"data":"QUJD","format":"wav"}},{"type":"image_url","image_url":{"url":"data:image/png;base64,\u0041"}}]`,
			`[{"type":"image_url","image_url":{"detail":"high","url":"https://a","url":"https://b"},"image_url":{"url":"second"}},{"type":"image_url","image_url":"not an object"},{"type":"image_url"},{"type":"input_audio","input_audio":{"data":7}}]`,
			// Keys with escapes: gjson takes the first member whose decoded
			// key matches, before or after a plain one.
			`[{"type":"image_url","x\n":0,"image\u005furl":{"url":"escaped first"},"image_url":{"url":"plain"}},{"type":"image_url","image_url":{"url":"plain first"},"image\u005furl":{"url":"escaped later"}},{"type":"input_audio","\u0069nput_audio":{"data":"escaped"},"input_audio":{"data":"plain"}}]`,
		} {
			// A long last message, so that the parts and calls are in
			// complete blocks.
			long := strings.Repeat("after the calls ", 40)
			body := `{"model":"m","messages":[{"role":"user","content":` + parts + `},{"role":"assistant","content":null,"tool_calls":` + calls + `},{"role":"user","content":"` + long + `"}]}`
			if _, err := p.parse([]byte(body), apiChat); err != nil {
				t.Fatalf("%s: %s", body, err.Message)
			}
			doc := gjson.Parse(body)
			ref.Reset("m", "", "")
			msgs := doc.Get("messages").Array()
			ref.BeginMessage("user")
			for _, part := range msgs[0].Get("content").Array() {
				switch typ := part.Get("type").String(); typ {
				case "text":
					ref.Text(part.Get("text").String())
				case "image_url":
					ref.Part(typ, part.Get("image_url.url").String())
				default:
					ref.Part(typ, part.Get("input_audio.data").String())
				}
			}
			ref.BeginMessage("assistant")
			for _, c := range msgs[1].Get("tool_calls").Array() {
				fn := c.Get("function")
				ref.ToolCall(c.Get("id").String(), fn.Get("name").String(), fn.Get("arguments").String())
			}
			ref.Message("user", long)
			if len(ref.Blocks()) < 2 || !slices.Equal(p.hasher.Blocks(), ref.Blocks()) || p.hasher.Len() != ref.Len() {
				t.Errorf("%s: parse hashed %d bytes, gjson reading %d", body, p.hasher.Len(), ref.Len())
			}
		}
	}
}
