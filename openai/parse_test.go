package openai

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/openai/openaitest"
	"github.com/kvroute/kvroute/snapshot"
)

func newParser(t testing.TB, cfgJSON string) *Parser {
	cfg, err := config.Parse([]byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	return &Parser{cfg: cfg, hasher: index.NewHasher(index.HashConfig{})}
}

func TestParseFields(t *testing.T) {
	p := newParser(t, `{"loraAdapters":{"sql-lora":"llama-3-8b"}}`)
	r, err := p.Parse([]byte(`{"model":"sql-lora","prompt":"`+strings.Repeat("x", 4000)+`","stream":true,"max_tokens":64,"user":"alice"}`), Completions)
	if err != nil {
		t.Fatal(err.Message)
	}
	if r.Model != "llama-3-8b" || r.Adapter != "sql-lora" || !r.Stream || r.MaxTokens != 64 || r.SessionKey != "alice" || r.PromptTokens != 1000 {
		t.Errorf("parsed %+v", r)
	}
	if len(p.hasher.Blocks()) == 0 {
		t.Error("no blocks hashed")
	}
	r, err = p.Parse([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":9}`), OtherEndpoint)
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
		r, err := p.Parse([]byte(`{"model":"m","prompt":"hello",`+tc.fields+`}`), Completions)
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
	// The request carries the prompt's chain and length: the caller reads
	// nothing of the parser.
	chain := func(body string, kind Endpoint) []uint64 {
		r, err := p.Parse([]byte(body), kind)
		if err != nil {
			t.Fatal(err.Message)
		}
		if len(r.Chain) == 0 || r.Tokens == nil || r.PromptChars < len(sys) || r.Tokens.TokensIn(len(r.Chain)+1) != r.PromptTokens {
			t.Fatalf("request: %d blocks, %d chars, %d tokens (hasher %v)", len(r.Chain), r.PromptChars, r.PromptTokens, r.Tokens != nil)
		}
		return append([]uint64(nil), r.Chain...)
	}
	a := chain(chatBody(sys, "one"), Chat)
	b := chain(chatBody(sys, "two"), Chat)
	if len(a) < 4 || a[0] != b[0] || a[3] != b[3] {
		t.Errorf("shared prefix does not share leading blocks: %x vs %x", a[:4], b[:4])
	}
	c := chain(strings.Replace(chatBody(sys, "one"), `"llama-3-8b"`, `"other"`, 1), Chat)
	if c[0] == a[0] {
		t.Error("another model shares block hashes")
	}
}

func TestErrorBodyIsOpenAIStyle(t *testing.T) {
	e := BadRequest("messages[0].role", "'%s' must be a non-empty string", "messages[0].role")
	b := string(e.Body())
	if !gjson.Valid(b) || gjson.Get(b, "error.type").String() != "invalid_request_error" ||
		gjson.Get(b, "error.param").String() != "messages[0].role" || gjson.Get(b, "error.code").Int() != 400 {
		t.Errorf("body %s", b)
	}
}

func FuzzParseRequest(f *testing.F) {
	// Seeds: each malformed shape the router's bad-input table
	// (filter.TestBadInputTable) sends, and valid unusual ones.
	for _, seed := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"m","prompt":"hel`},
		{"/v1/completions", `["m","hello"]`},
		{"/v1/completions", `{"prompt":"hello"}`},
		{"/v1/completions", `{"model":7,"prompt":"hello"}`},
		{"/v1/completions", `{"model":"m"}`},
		{"/v1/completions", `{"model":"m","prompt":{"text":"x"}}`},
		{"/v1/completions", `{"model":"m","prompt":""}`},
		{"/v1/completions", `{"model":"m","prompt":[1,-2,3]}`},
		{"/v1/completions", `{"model":"m","prompt":[1,2.5]}`},
		{"/v1/completions", `{"model":"m","prompt":"x","max_tokens":"9"}`},
		{"/v1/completions", `{"model":"m","prompt":"x","stream":"yes"}`},
		{"/v1/chat/completions", `{"model":"m","messages":"hi"}`},
		{"/v1/chat/completions", `{"model":"m","messages":[]}`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"content":"hi"}]}`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":5}]}`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}`},
		{"/v1/completions", "{\"model\":\"m\",\"prompt\":\"\xff\xfe\"}"},
		{"/v1/completions", ""},
		{"/v1/completions", `{"model":"m","prompt":[101,2023,2003,1037,3231]}`},
		{"/v1/completions", `{"model":"m","prompt":[[1,2],[3,4]]}`},
		{"/v1/chat/completions", `{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`},
		{"/v1/embeddings", `{"model":"m","input":["a","b"]}`},
	} {
		f.Add([]byte(seed.body), uint8(EndpointOf(seed.path)))
	}
	f.Add([]byte(`{"model":"m","prompt":[[1,2],[3]]}`), uint8(Completions))
	f.Add([]byte(`{"model":"m","input":"x"}`), uint8(OtherEndpoint))
	p := newParser(f, `{"loraAdapters":{"a":"b"}}`)
	// The walker's word tests read past a value, up to the end of the
	// body's buffer (the filter keeps room there, see filter.bodySlack):
	// the same body with room after it holding the bytes most likely to
	// mislead them must parse exactly as it does alone.
	tail := []byte(`":,"}]{[0\"":":,"}"]"{"a":0,"b":"\u00e9"}]}"x":1,` + strings.Repeat(`"a":`, 10))
	padded := newParser(f, `{"loraAdapters":{"a":"b"}}`)
	f.Fuzz(func(t *testing.T, body []byte, kind uint8) {
		buf := append(append(make([]byte, 0, len(body)+len(tail)), body...), tail...)
		pr, perr := padded.Parse(buf[:len(body)], Endpoint(kind%4))
		pchain := slices.Clone(pr.Chain)
		r, err := p.Parse(body, Endpoint(kind%4))
		if (err == nil) != (perr == nil) || err != nil && err.Message != perr.Message ||
			r.Model != pr.Model || !slices.Equal(r.Chain, pchain) || r.PromptChars != pr.PromptChars {
			t.Fatalf("%q parses differently with bytes after it", body)
		}
		if err != nil {
			if err.Status != 400 || err.Message == "" || !gjson.ValidBytes(err.Body()) {
				t.Fatalf("bad error %+v", err)
			}
			return
		}
		if r.Model == "" || r.MaxTokens < 0 || r.PromptTokens < 0 {
			t.Fatalf("accepted request breaks invariants: %+v", r)
		}
	})
}

// Keys count as the engine's JSON decoder reads them: an escaped
// kv_transfer_params is still removed, an escaped "model" is still the model.
func TestEscapedKeysCountAsDecoded(t *testing.T) {
	p := newParser(t, `{}`)
	body := []byte(`{"mod\u0065l":"m","kv_transfer_p\u0061rams":{"remote_host":"169.254.169.254"},"prompt":"hi"}`)
	r, err := p.Parse(body, Completions)
	if err != nil {
		t.Fatal(err.Message)
	}
	if r.Model != "m" || r.ClientOnly != 1 {
		t.Errorf("model %q, %d client-only members; want m, 1", r.Model, r.ClientOnly)
	}
	clean := p.WithoutClientOnly(body)
	if p.dropped != 1 || strings.Contains(string(clean), "169.254") || gjson.GetBytes(clean, "prompt").Str != "hi" {
		t.Errorf("dropped %d, forwarded %s", p.dropped, clean)
	}
}

// WithoutClientOnly walks the members again after parse (which only counts
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
		if _, err := p.Parse([]byte(body), Chat); err != nil {
			t.Fatalf("%s: %s", body, err.Message)
		}
		got := p.WithoutClientOnly([]byte(body))
		if p.dropped != dropped || string(got) != "{"+strings.Join(want, ",")+"}" {
			t.Errorf("%s:\ndropped %d, forwarded %s", body, p.dropped, got)
		}
	}
	p := newParser(t, `{}`)
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	if _, err := p.Parse(body, Chat); err != nil || p.WithoutClientOnly(body) != nil {
		t.Errorf("a body without client-only members: err %v, forwarded %s", err, p.WithoutClientOnly(body))
	}
}

// rawWholeNumber reads what snapshot.WholeNumber reads from gjson, for every kind of
// JSON number, with or without its fast path.
func TestRawWholeNumberMatchesGJSON(t *testing.T) {
	for _, v := range []string{
		"0", "-0", "4", "-1", "10", "4096", "123456789012345678", "-123456789012345678",
		"1234567890123456789", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
		"-9223372036854775809", "99999999999999999999", "1e3", "1E3", "2.0", "2.5", "-2.0", "1.5e300", "0.0", "1e-3",
	} {
		n, ok := rawWholeNumber([]byte(v))
		wn, wok := snapshot.WholeNumber(gjson.Parse(v))
		if n != wn || ok != wok {
			t.Errorf("rawWholeNumber(%s) = %d, %v; snapshot.WholeNumber = %d, %v", v, n, ok, wn, wok)
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
	p.trim.budget = math.MaxInt / 2 // the whole body: what gjson reads
	// q reads each body under a small budget (see readBudget): a prefix of
	// the prompt, the same model and max_tokens.
	q := newParser(t, `{}`)
	cutBodies := 0
	for trial := 0; trial < 400; trial++ {
		q.trim.budget = 1 << (6 + rng.Intn(10))
		var body strings.Builder
		model := []string{`"llama-3-8b"`, `"m\u00e9"`, `"mod\"el"`}[rng.Intn(3)]
		body.WriteString("{" + ws() + `"model"` + ws() + ":" + ws() + model + ws())
		kind := Chat
		tokens := false
		switch rng.Intn(7) {
		case 5:
			// Batches of token ids, many and small (the parser gathers
			// them across arrays) or few and long.
			kind, tokens = Completions, true
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
			kind = Completions
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
			kind, tokens = Completions, true
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
			kind = Completions
			body.WriteString(`,"prompt":` + ws() + str())
		case 1:
			kind = Completions
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

		r, perr := p.Parse(b, kind)
		if perr != nil {
			t.Fatalf("trial %d: %s\n%.300s", trial, perr.Message, b)
		}
		// The same with gjson alone.
		doc := gjson.ParseBytes(b)
		ref.Reset(doc.Get("model").String(), "", "")
		if kind == Chat {
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
		rq, qerr := q.Parse(b, kind)
		if qerr != nil {
			t.Fatalf("trial %d: with a budget of %d: %s\n%.300s", trial, q.trim.budget, qerr.Message, b)
		}
		cut := q.hasher.Blocks()
		if full := ref.Blocks(); len(cut) > len(full) || len(cut) > 0 && !slices.Equal(cut[:len(cut)-1], full[:len(cut)-1]) ||
			rq.Model != r.Model || rq.MaxTokens != r.MaxTokens || len(q.trim.cuts) == 0 && !slices.Equal(cut, full) {
			t.Fatalf("trial %d: with a budget of %d (%d cuts): %d blocks, model %q, max_tokens %d; the whole body: %d blocks, %q, %d\n%.300s",
				trial, q.trim.budget, len(q.trim.cuts), len(cut), rq.Model, rq.MaxTokens, len(full), r.Model, r.MaxTokens, b)
		}
		if len(q.trim.cuts) > 0 {
			cutBodies++
		}
	}
	if cutBodies < 100 {
		t.Errorf("%d of 400 bodies cut under the small budgets: the prefix check hardly ran", cutBodies)
	}
}

// FuzzPromptMatchesGJSONReading checks that a completions prompt the parser
// accepts hashes as a plain reading of it with gjson does, one hasher call
// per string or token id: the parser gathers the elements of prompt arrays
// into batches, which must hash exactly as the pieces.
func FuzzPromptMatchesGJSONReading(f *testing.F) {
	for _, s := range openaitest.Shapes {
		if EndpointOf(s.Path) == Completions {
			f.Add([]byte(s.Body(300, 1)))
		}
	}
	f.Add([]byte(`{"model":"m","prompt":[[1, 2 ,3],[4.0],[5e0,4294967295]]}`))
	f.Add([]byte(`{"model":"m","prompt":["", "a\nb", "\u00e9", ""],"cache_salt":"s"}`))
	f.Add([]byte(`{"model":"m","prompt":[7,8,9],"prompt":"last wins"}`))
	f.Add([]byte(`{"model":"m","日\u00e9 ":"","prompt":"p","é\n":[1],"\n\u0070rompt":"no","` + strings.Repeat("é", 40) + `\n":0,"pr\u006fmpt":"decoded, last"}`))
	p := newParser(f, `{}`)
	ref := index.NewHasher(index.HashConfig{})
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := p.Parse(body, Completions)
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
			// Types spelled with escapes, types of 8, 9, 16 and 17 bytes,
			// and types no case reads (hashed whole).
			`[{"type":"t\u0065xt","text":"escaped type"},{"type":"image\u005furl","image_url":{"url":"u"}},{"type":"video","video":{"u":1}},{"type":"texttext","text":"x"},{"type":"image_urx","image_url":{"url":"u"}},{"type":"input_audio_16byt","input_audio":{"data":"d"}},{"type":"input_audio_17byte","x":[]},{"type":"input_audi\u006f","input_audio":{"data":"d"}}]`,
			// Values object reads without skip: a short string with one
			// escape and up to 8 other bytes (any above 0x7f) before its
			// closing quote, and an empty container after a key that is
			// not plain.
			`[{"text":"\\","type":"text","\né":{}},{"type":"text","text":"a\n","k\u00e9":[],"x":"\u0041b\t"},{"type":"text","text":"\"","\u00e9":{"a":[]}},{"type":"text","text":"\u0041"}]`,
			// Keys that name no key of a set, found by their first byte
			// to look at (above 0x7f, or an escape other than \u), some
			// ending within 8 bytes after it, some not.
			`[{"type":"text","\"":"\"","text":"after an escaped quote key","é\n":1,"\nabcdefghijk":{},"\\":[],"x\t\u0069mage_url":{"url":"no"}},{"é":"x","\/":0,"type":"image_url","image_url":{"url":"after"},"\r\u0069mage_url":{"url":"not this"}}]`,
			// Strings of one escape alone, whose text is a view of
			// unescapedText.
			`[{"type":"text","text":"\/"},{"type":"text","text":"\b"},{"type":"text","text":"\f"},{"type":"text","text":"\r"},{"type":"text","text":"\t"},{"type":"image_url","image_url":{"url":"\n"}},{"type":"\""}]`,
			// Keys with text other than ASCII or an escape other than \u
			// first and more escapes after it, ending within the word
			// test or not (long ones past a span table entry's length).
			`[{"日\u00e9 ":"","type":"text","é\n\t\u0041":[1],"text":"after","\n\u0074ext":"no","日本語のキー\u0074ext\n":{"a":1},"é` + strings.Repeat("x", 70) + `\n":0,"\t` + strings.Repeat("\u0074", 12) + `":"no"},{"type":"text","é\"\"":"","text":"second"}]`,
			`[{"type":"text","text":"\n日"},{"type":"text","text":"\nabcdefgh"},{"type":"text","text":"\nabcdefghi"},{"type":"text","text":"\u00e9x\n"},{"type":"image_url","image_url":{"url":"\n日"}}]`,
			`[{"type":"image_url","x\n":0,"image\u005furl":{"url":"escaped first"},"image_url":{"url":"plain"}},{"type":"image_url","image_url":{"url":"plain first"},"image\u005furl":{"url":"escaped later"}},{"type":"input_audio","\u0069nput_audio":{"data":"escaped"},"input_audio":{"data":"plain"}}]`,
		} {
			// A long last message, so that the parts and calls are in
			// complete blocks.
			long := strings.Repeat("after the calls ", 40)
			body := `{"model":"m","messages":[{"role":"user","content":` + parts + `},{"role":"assistant","content":null,"tool_calls":` + calls + `},{"role":"user","content":"` + long + `"}]}`
			if _, err := p.Parse([]byte(body), Chat); err != nil {
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
				case "input_audio":
					ref.Part(typ, part.Get("input_audio.data").String())
				default:
					ref.Part(typ, part.Raw)
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

func chatBody(system, user string) string {
	return fmt.Sprintf(`{"model":"llama-3-8b","messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":4}`, system, user)
}

// TestTokenRunsMatchTheReader checks that a long token-id prompt, whose ids
// the validating pass reads (see tokenRun), is accepted, refused and hashed
// exactly as the parser's own reading of a short one: an id past
// maxTokenID or an empty batch anywhere refuses it, and the ids hash as
// one id at a time do.
func TestTokenRunsMatchTheReader(t *testing.T) {
	p := newParser(t, `{}`)
	ref := index.NewHasher(index.HashConfig{})
	long := strings.Repeat("123,", 400) // 6,400 bytes of ids: several blocks
	for _, tc := range []struct {
		prompt string
		ok     bool
	}{
		{"[" + long + "7]", true},
		{"[" + long + "4294967295]", true},
		{"[" + long + "4294967296]", false},
		{"[" + long + "12345678901]", false},
		{"[[" + long + "7],[8]]", true},
		{"[[" + long + "7],[]]", false},
		{"[[" + long + "7],[8],[4294967296]]", false},
		// batches of ids of every length idBatchRun reads, and longer
		{"[[" + strings.Repeat("1,22],[333,4444444],[55555,6],[7777777,88],[666666,", 100) + "9]]", true},
		{"[[" + strings.Repeat("1,22],[333,4444444],[", 100) + "12345678,1],[2,3000000000]]", true},
		// spaced as Python's json.dumps writes them (spacedIDRun), and
		// with what ends such a run among them
		{"[" + strings.Repeat("123, ", 400) + "7]", true},
		{"[[" + strings.Repeat("1, 22], [333, 4444444], [55555, 6], [7777777, 88], [666666, ", 100) + "9]]", true},
		{"[" + strings.Repeat("123, ", 400) + "12345678, 9,  10 , 4294967295]", true},
		{"[[" + strings.Repeat("1, 22], [", 200) + "12345678, 1], [2, 3], [4,5],[6] , [ 7]]", true},
		{"[" + strings.Repeat("123, ", 400) + "4294967296, 7]", false},
		{"[[" + strings.Repeat("1, 22], [", 200) + "7], []]", false},
	} {
		body := []byte(`{"model":"m","prompt":` + tc.prompt + `}`)
		_, err := p.Parse(body, Completions)
		if (err == nil) != tc.ok {
			t.Errorf("%s: error %v, want ok %v", tc.prompt, err, tc.ok)
			continue
		}
		if !tc.ok {
			if err.Param != "prompt" && !strings.HasPrefix(err.Param, "prompt[") {
				t.Errorf("%s: error names %q", tc.prompt, err.Param)
			}
			continue
		}
		if len(p.doc.runs) != 1 {
			t.Errorf("%s: the validating pass read %d runs, want 1", tc.prompt, len(p.doc.runs))
		}
		ref.Reset("m", "", "")
		gjson.Get(string(body), "prompt|@flatten").ForEach(func(_, v gjson.Result) bool {
			ref.Token(uint32(v.Uint()))
			return true
		})
		if !slices.Equal(p.hasher.Blocks(), ref.Blocks()) || p.hasher.Len() != ref.Len() {
			t.Errorf("%s: hashed %d blocks (%d bytes), one id at a time %d (%d)", tc.prompt, len(p.hasher.Blocks()), p.hasher.Len(), len(ref.Blocks()), ref.Len())
		}
	}
}

// TestTextRunsMatchTheReader is TestTokenRunsMatchTheReader for a long
// prompt of strings, whose text the validating pass gathers (see
// stringArray): escapes, non-ASCII text and empty strings hash as one
// string at a time does, and a string that is not UTF-8 or an element that
// is not a string refuses it as before.
func TestTextRunsMatchTheReader(t *testing.T) {
	p := newParser(t, `{}`)
	ref := index.NewHasher(index.HashConfig{})
	long := strings.Repeat(`"ab",""," c\nd \u00e9\ud83d\ude00","日本語のテキスト","`+strings.Repeat("x", 70)+`",`+
		`"\n","abcdefgh\t","abcdefghi\t","\\","\"","a\/","\u0041","\n\n","a\nb",`+
		`"éé\t","é\n","éééé\"","日\\","é\né","é\u00e9","ééééé\t","д\nд\tü","\nßß",`+
		`"\"é日","日\u00e9","\u65e5\n","\t\u0000","\\\u00e9\n","\ud83d\ude00!","\"\uffff",`, 30)
	for _, tc := range []struct {
		prompt, param string // param: "" for accepted
	}{
		{"[" + long + `"end"]`, ""},
		{"[" + long + `"\/"]`, ""},
		{"[" + long + "\"\xff\"]", "-"},
		{"[\"\xc3\\t\"," + long + `"end"]`, "-"},
		{"[\"\xc0\x80\\n\"," + long + `"end"]`, "-"},
		{"[\"\xc3\xa9\xa9\\t\"," + long + `"end"]`, "-"},
		{"[" + long + `7]`, "prompt"},
		{"[" + long + `"a" ]`, ""},
		// spaced as json.dumps writes them, and with other spaces among them
		{"[" + strings.ReplaceAll(long, `",`, `", `) + `"end"]`, ""},
		{"[" + strings.ReplaceAll(long, `",`, `", `) + `"a",  "b", "c" , "d",` + "\n\"e\", \"\xff\"]", "-"},
		{"[" + strings.ReplaceAll(long, `",`, `", `) + `7]`, "prompt"},
	} {
		body := []byte(`{"model":"m","prompt":` + tc.prompt + `}`)
		_, err := p.Parse(body, Completions)
		switch {
		case tc.param == "" && err != nil:
			t.Errorf("%.40s: %s", tc.prompt, err.Message)
			continue
		case tc.param == "-" && err != errBodyNotUTF8:
			t.Errorf("%.40s: error %v, want the UTF-8 one", tc.prompt, err)
			continue
		case tc.param != "" && tc.param != "-" && (err == nil || err.Param != tc.param || !strings.Contains(err.Message, "prompt[900]")):
			t.Errorf("%.40s: error %v, want one naming %s[900]", tc.prompt, err, tc.param)
			continue
		case tc.param != "":
			continue
		}
		ref.Reset("m", "", "")
		gjson.Get(string(body), "prompt").ForEach(func(_, v gjson.Result) bool {
			ref.Text(v.String())
			return true
		})
		if !slices.Equal(p.hasher.Blocks(), ref.Blocks()) || p.hasher.Len() != ref.Len() {
			t.Errorf("%.40s: hashed %d blocks (%d bytes), one string at a time %d (%d)", tc.prompt, len(p.hasher.Blocks()), p.hasher.Len(), len(ref.Blocks()), ref.Len())
		}
	}
	// The last case has a space before its bracket: no run, the reader's way.
	if _, err := p.Parse([]byte(`{"model":"m","prompt":[`+long+`"end"]}`), Completions); err != nil || len(p.doc.textRuns) != 1 {
		t.Errorf("the validating pass gathered %d texts (error %v), want 1", len(p.doc.textRuns), err)
	}
	// Separated by other whitespace too.
	if _, err := p.Parse([]byte(`{"model":"m","prompt":[`+strings.ReplaceAll(long, `",`, "\",\t\n")+`"end"]}`), Completions); err != nil || len(p.doc.textRuns) != 1 {
		t.Errorf("tabs and newlines: the validating pass gathered %d texts (error %v), want 1", len(p.doc.textRuns), err)
	}
	// Spaced as json.dumps writes them, the strings make one run too.
	if _, err := p.Parse([]byte(`{"model":"m","prompt":[`+strings.ReplaceAll(long, `",`, `", `)+`"end"]}`), Completions); err != nil || len(p.doc.textRuns) != 1 {
		t.Errorf("spaced: the validating pass gathered %d texts (error %v), want 1", len(p.doc.textRuns), err)
	}
}
