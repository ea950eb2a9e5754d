package openai

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/snapshot"
)

// Request parsing reads the few fields routing needs straight out of the
// body with gjson: no full unmarshal, no copy of the prompt beyond what the
// hasher consumes, and prompt text never leaves this file except as block
// hashes.

// Endpoint is the OpenAI endpoint a path addresses.
type Endpoint uint8

const (
	Completions Endpoint = iota
	Chat
	Embeddings
	OtherEndpoint // a configured inference path with another suffix: sniff the body
)

func EndpointOf(path string) Endpoint {
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return Chat
	case strings.HasSuffix(path, "/completions"):
		return Completions
	case strings.HasSuffix(path, "/embeddings"):
		return Embeddings
	}
	return OtherEndpoint
}

// Request is what routing needs from one body, all of it: the caller
// reads nothing else of the parser. No prompt text, and no string that
// aliases the body (which is reused).
type Request struct {
	Model, Adapter string
	SessionKey     string // the body's "user"
	Stream         bool
	// StreamUsage: a streamed request asked for a usage chunk at the end
	// of the stream (stream_options.include_usage true), so its chunks are
	// read for cached_tokens. ContinuousUsage: it asked only for vLLM's
	// continuous_usage_stats (usage in every chunk), which an engine may
	// ignore: the first chunk decides whether the rest are read.
	StreamUsage     bool
	ContinuousUsage bool
	MaxTokens       int
	PromptTokens    int
	// The prompt as routing sees it: Chain is its block hash chain, Tokens
	// the hasher that cut it (it counts the tokens of leading blocks), and
	// PromptChars its canonical length in characters. They are the
	// parser's, valid until its next Parse.
	Chain       []uint64
	Tokens      *index.Hasher
	PromptChars int
	// ClientOnly counts the gateway-only members (kv_transfer_params,
	// bootstrap_*) the body held: the body goes on only without them
	// (Parser.WithoutClientOnly).
	ClientOnly int
}

// Error is a client error: the filter answers it locally with an
// OpenAI-style body, and the request never reaches an engine.
type Error struct {
	Status  int
	Param   string // the offending field, "" for the body as a whole
	Message string
	Code    string // OpenAI's error code ("model_not_found"); "" writes Status
	Type    string // OpenAI's error type; "" is invalid_request_error (the client's fault)
}

func BadRequest(param, format string, args ...any) *Error {
	msg := format
	if len(args) > 0 {
		msg = sprintf(format, args...)
	}
	return &Error{Status: 400, Param: param, Message: msg}
}

// The client errors that name no value, built once: they are never
// modified, and in Wasm each BadRequest call is ~90 instructions of the
// function that makes it, which every request enters.
var (
	errEmptyBody     = BadRequest("", "the request body is empty: send a JSON object with \"model\" and a prompt")
	errBodyNotUTF8   = BadRequest("", "the request body is not valid UTF-8")
	errBodyNotJSON   = BadRequest("", "the request body is not valid JSON")
	errBodyNotObject = BadRequest("", "the request body must be a JSON object")
	errNoModel       = BadRequest("model", "'model' is required")
	errBadModel      = BadRequest("model", "'model' must be a non-empty string")
	errBadStream     = BadRequest("stream", "'stream' must be a boolean")
	errBadUser       = BadRequest("user", "'user' must be a string")
	errBadSalt       = BadRequest("cache_salt", "'cache_salt' must be a string")
	errNoPrompt      = BadRequest("", "the body has no 'messages', 'prompt' or 'input'")
	errBadTools      = BadRequest("tools", "'tools' must be an array")
	errNoMessages    = BadRequest("messages", "'messages' is required")
	errBadMessages   = BadRequest("messages", "'messages' must be an array of message objects")
	errEmptyMessages = BadRequest("messages", "'messages' must not be empty")

	// By field, from fieldMaxTokens on: built once, where an array
	// literal in parse would be built at each request.
	errBadMaxTokens = [...]*Error{maxTokensError("max_tokens"), maxTokensError("max_completion_tokens")}
)

// body renders the OpenAI error object.
func (e *Error) Body() []byte {
	typ := e.Type
	if typ == "" {
		typ = "invalid_request_error"
	}
	b := []byte(`{"error":{"message":`)
	b = gjson.AppendJSONString(b, e.Message)
	b = append(b, `,"type":`...)
	b = gjson.AppendJSONString(b, typ)
	b = append(b, `,"param":`...)
	if e.Param == "" {
		b = append(b, "null"...)
	} else {
		b = gjson.AppendJSONString(b, e.Param)
	}
	b = append(b, `,"code":`...)
	if e.Code != "" {
		b = gjson.AppendJSONString(b, e.Code)
	} else {
		b = strconv.AppendInt(b, int64(e.Status), 10)
	}
	return append(b, "}}"...)
}

// Bounds on numbers a client may send.
const (
	maxMaxTokens = 1 << 24
	maxTokenID   = 1<<32 - 1
)

// Parser parses bodies into a hasher; one per VM, reused.
type Parser struct {
	cfg    *config.Config
	hasher *index.Hasher
	ids    []uint32 // token ids gathered for the hasher (see tokenIDs)
	text   []byte   // prompt strings gathered for the hasher (see texts)

	// The body being parsed with its span table (see jsonSpans), so that
	// walking the messages, a message and its content does not rescan the
	// prompt at each level. Its buffers are kept for the next body.
	doc jsonDoc
	// The first pass over a body: the view of it doc reads (see
	// readBudget).
	trim trimmer

	// models holds the model names seen, so that a parsed request owns its
	// Model without a copy per request: the body it came from is reused
	// (see routerPlugin.readBody), and admission may hold a request past
	// the next body.
	models map[string]string
	last   string // the last model returned by owned: most bodies name it again

	// How many top-level members of the last body must not reach an
	// engine (see firstClientOnly), and the buffer WithoutClientOnly
	// builds the body without them in.
	dropped int
	out     []byte
}

// NewParser returns a parser for requests under cfg that feeds each
// prompt to hasher.
func NewParser(cfg *config.Config, hasher *index.Hasher) Parser {
	return Parser{cfg: cfg, hasher: hasher}
}

// Hasher is the hasher the last parsed prompt was fed to: its blocks and
// token count are the request's.
func (p *Parser) Hasher() *index.Hasher { return p.hasher }

// Dropped is how many gateway-only members (see firstClientOnly) the last
// body parsed or scrubbed held.
func (p *Parser) Dropped() int { return p.dropped }

// The top-level members parse looks at, by index in requestFields.
const (
	fieldModel = iota
	fieldStream
	fieldMaxTokens
	fieldMaxCompletion
	fieldUser
	fieldSalt
	fieldMessages
	fieldTools
	fieldPrompt
	fieldInput
	fieldStreamOptions
	// From here on the fields by which one engine is told to pull KV
	// from, or pair with, another (vLLM's NixlConnector
	// kv_transfer_params, SGLang's bootstrap pairing). Only kvroute.pd may
	// set them: from a client they would make an engine connect to a host
	// the client names. The router removes them from every request it
	// routes.
	firstClientOnly
)

var requestFields = [...]string{
	fieldModel:          "model",
	fieldStream:         "stream",
	fieldMaxTokens:      "max_tokens",
	fieldMaxCompletion:  "max_completion_tokens",
	fieldUser:           "user",
	fieldSalt:           "cache_salt",
	fieldMessages:       "messages",
	fieldTools:          "tools",
	fieldPrompt:         "prompt",
	fieldInput:          "input",
	fieldStreamOptions:  "stream_options",
	firstClientOnly:     "kv_transfer_params",
	firstClientOnly + 1: "bootstrap_host",
	firstClientOnly + 2: "bootstrap_port",
	firstClientOnly + 3: "bootstrap_room",
}

// fieldOf returns the index of key in fields, or -1. The parser matches keys
// with this one loop rather than with a comparison per key inlined where it
// reads them: each function entered costs a request (docs/performance.md), and
// those copies would make parse and chat kilobytes larger.
func fieldOf(key string, fields []string) int {
	if uint(len(key)) >= 64 || fieldLengths>>len(key)&1 == 0 {
		return -1 // no field of any list is that long
	}
	for n, f := range fields {
		if is(key, f) {
			return n
		}
	}
	return -1
}

// fieldLengths has bit n set when a field of requestFields or
// streamUsageFields is n bytes long: fieldOf rejects a key of another
// length at once, where a body of many unused keys made it compare each
// with every field.
var fieldLengths = func() (m uint64) {
	for _, fields := range [][]string{requestFields[:], streamUsageFields[:]} {
		for _, f := range fields {
			m |= 1 << len(f)
		}
	}
	return m
}()

// is reports whether s == lit. The parser compares keys with it rather than
// with == or a switch: in Wasm the compiler calls the runtime's memequal
// for strings longer than 6 bytes, and a key is only a few bytes.
func is(s, lit string) bool {
	if len(s) != len(lit) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] != lit[i] {
			return false
		}
	}
	return true
}

// maxModelNames bounds models: names beyond it are copied per request.
const maxModelNames = 256

// owned returns s as a string that does not alias the body. Small enough
// to be inlined: most bodies name the last model again, and then a request
// enters no function for it (in Wasm every map operation costs, and every
// function entered). It compares with == (is would make it too big to be
// inlined): the runtime's memequal that calls is entered by every request
// anyway.
func (p *Parser) owned(s string) string {
	if s == p.last {
		return p.last
	}
	return p.remember(s)
}

// remember is owned for a model other than the last one.
func (p *Parser) remember(s string) string {
	if m, ok := p.models[s]; ok {
		p.last = m
		return m
	}
	m := strings.Clone(s)
	if p.models == nil {
		p.models = map[string]string{}
	}
	if len(p.models) < maxModelNames {
		p.models[m] = m
		p.last = m
	}
	return m
}

// WithoutClientOnly returns body, which parse has just accepted, without
// its client-only members (see firstClientOnly), or nil when it has none.
// The result is reused by the next call. Small enough to be inlined: a
// body without such members, nearly every one, enters no function here.
func (p *Parser) WithoutClientOnly(body []byte) []byte {
	if p.dropped == 0 {
		return nil
	}
	return p.dropClientOnly(body)
}

// dropClientOnly is WithoutClientOnly for a body with client-only members.
// It copies the other members as the read budget's first pass found them
// in body (trimmer.members), whether or not the parser read a view of it:
// parse only counts them, so that the many bodies without any record no
// member list (each function entered costs a request: docs/performance.md).
func (p *Parser) dropClientOnly(body []byte) []byte {
	out := append(p.out[:0], '{')
	first := true
	for _, m := range p.trim.members[:p.trim.n] {
		if raw := body[m.key:m.end]; !p.clientOnly(raw) {
			if !first {
				out = append(out, ',')
			}
			out = append(out, raw...)
			first = false
		}
	}
	p.out = append(out, '}')
	return p.out
}

// clientOnly reports whether the member raw (from its key's quote) is a
// client-only one (see firstClientOnly), its key read as the engine's JSON
// decoder reads it.
func (p *Parser) clientOnly(raw []byte) bool {
	return fieldOf(p.keyText(raw[:stringEnd(raw, 0)]), requestFields[:]) >= firstClientOnly
}

// parse validates body for kind and feeds its prompt to the hasher. r is
// a named result so that it is built in place: with a local returned at
// each of the dozen returns, each one would copy the whole struct, ~300
// bytes of Wasm in a function every request enters. For the same
// reason what few requests send (a LoRA adapter, "user" and "cache_salt",
// an endpoint to sniff, a prompt other than messages) is read out of line.
func (p *Parser) Parse(body []byte, kind Endpoint) (r Request, _ *Error) {
	if len(body) == 0 {
		return r, errEmptyBody
	}
	// The structure first, to read no more of it than the budget covers
	// (see readBudget): body is the view from here on.
	body, err := p.trim.trim(body)
	if err != nil {
		return r, err
	}
	// One pass checks JSON and UTF-8 (in strings; everything else must be
	// ASCII); see scanError for a body it rejects.
	p.doc.checkUTF8 = true
	if !p.doc.scan(body) {
		return r, p.scanError(body)
	}
	// The walk starts inside the body's object, so the first value it
	// looks up is the table's second entry (the first is that object).
	p.doc.base, p.doc.next = cap(body), 1
	p.doc.unesc = p.doc.unesc[:0]
	obj := body[SkipSpace(body, 0):]
	if obj[0] != '{' {
		return r, errBodyNotObject
	}
	// One pass over the top-level members with the span walker (see
	// jsonwalk.go). A repeated key keeps its last value, as Python's json
	// module (vLLM, SGLang) does.
	// Keys as the engine's JSON decoder reads them: "mod\u0065l" is
	// "model", and an escaped kv_transfer_params must go too (counted in
	// dropped: the names past fields).
	var spans [firstClientOnly]valueSpan
	_, plain, dropped := p.doc.object(obj, 0, requestKeys, spans[:])
	p.dropped = dropped
	var fields [firstClientOnly][]byte // nil for a member the body does not hold
	for f, s := range &spans {
		if s.e != 0 {
			fields[f] = s.in(obj)
		}
	}
	model, stream := fields[fieldModel], fields[fieldStream]
	if model == nil {
		return r, errNoModel
	}
	if jsonType(model) != gjson.String || len(model) == 2 {
		return r, errBadModel
	}
	r.Model = p.owned(p.doc.str(model, plain>>fieldModel&1 != 0))
	if len(p.cfg.LoRAAdapters) > 0 { // no map operation when there is nothing to find
		p.adapter(&r)
	}
	if stream != nil {
		t := jsonType(stream)
		if t != gjson.True && t != gjson.False {
			return r, errBadStream
		}
		r.Stream = t == gjson.True
	}
	if so := fields[fieldStreamOptions]; r.Stream && so != nil && so[0] == '{' {
		u := p.streamUsage(so)
		r.StreamUsage, r.ContinuousUsage = u&usageAtEnd != 0, u == usageContinuous
	}
	// fieldMaxTokens, then fieldMaxCompletion; the later one wins.
	for f, bad := range &errBadMaxTokens {
		if v := fields[fieldMaxTokens+f]; v != nil && jsonType(v) != gjson.Null {
			n, ok := rawWholeNumber(v)
			if !ok || n < 0 || n > maxMaxTokens {
				return r, bad
			}
			r.MaxTokens = int(n)
		}
	}
	salt := ""
	if fields[fieldUser] != nil || fields[fieldSalt] != nil {
		var err *Error
		if salt, err = p.identity(&r, &fields); err != nil {
			return r, err
		}
	}

	p.hasher.Reset(r.Model, r.Adapter, salt)
	if kind == Chat {
		err = p.chat(&fields)
	} else {
		err = p.notChat(kind, &fields)
	}
	if err != nil {
		return r, err
	}
	h := p.hasher
	r.PromptTokens, r.Chain, r.Tokens, r.PromptChars = h.PromptTokens(), h.Blocks(), h, h.Len()
	if p.trim.removed > 0 { // (only in a view)
		// The elements left out, at a character per byte of their JSON:
		// what load and admission count the request's prompt as.
		r.PromptChars += p.trim.removed
		r.PromptTokens += p.trim.removed / index.DefaultCharsPerToken
	}
	r.ClientOnly = p.dropped
	return r, nil
}

// adapter maps r's model, when it names a configured LoRA adapter, to the
// adapter's base model. Not inlined: parse enters it only when adapters
// are configured.
//
//go:noinline
func (p *Parser) adapter(r *Request) {
	if base, ok := p.cfg.LoRAAdapters[r.Model]; ok {
		r.Model, r.Adapter = base, r.Model
	}
}

// identity reads the body's "user" (into r) and "cache_salt" (returned),
// either of which may be absent.
func (p *Parser) identity(r *Request, fields *[firstClientOnly][]byte) (string, *Error) {
	user, salt := fields[fieldUser], fields[fieldSalt]
	if user != nil && jsonType(user) != gjson.Null {
		if jsonType(user) != gjson.String {
			return "", errBadUser
		}
		r.SessionKey = strings.Clone(p.doc.text(user)) // kept by session affinity
	}
	if salt == nil {
		return "", nil
	}
	if jsonType(salt) != gjson.String {
		return "", errBadSalt
	}
	return p.doc.text(salt), nil
}

// notChat hashes the prompt of a body that is not a chat: a completions
// "prompt", an embeddings "input", or for an unknown endpoint whichever
// of "messages", "prompt" and "input" the body holds first in that order.
func (p *Parser) notChat(kind Endpoint, fields *[firstClientOnly][]byte) *Error {
	if kind == OtherEndpoint {
		switch {
		case fields[fieldMessages] != nil:
			return p.chat(fields)
		case fields[fieldPrompt] != nil:
			kind = Completions
		case fields[fieldInput] != nil:
			kind = Embeddings
		default:
			return errNoPrompt
		}
	}
	if kind == Embeddings {
		return p.prompt(fields[fieldInput], "input")
	}
	return p.prompt(fields[fieldPrompt], "prompt")
}

// scanError names why the validating pass rejected body: a failed pass looks
// at UTF-8 again only to name the error as a separate utf8.Valid pass would
// have. Out of parse (not inlined): each function entered costs a request
// (docs/performance.md), and a valid body never comes here.
//
//go:noinline
func (p *Parser) scanError(body []byte) *Error {
	if p.doc.badUTF8 || !utf8.Valid(body) {
		return errBodyNotUTF8
	}
	return errBodyNotJSON
}

// maxTokensError is the error for a bad max_tokens or
// max_completion_tokens.
func maxTokensError(name string) *Error {
	return BadRequest(name, "'%s' must be a whole number from 0 to %d", name, maxMaxTokens)
}

// rawWholeNumber is snapshot.WholeNumber of a raw JSON value. A plain integer of up
// to 18 digits (every max_tokens and token id in practice) is read here
// without gjson, whose Parse also runs a float parse of every number: in
// Wasm that code is cold at each request, and a token-id prompt parsed each
// id that way.
func rawWholeNumber(v []byte) (int64, bool) {
	d := v
	if len(d) > 0 && d[0] == '-' {
		d = d[1:]
	}
	plain := len(d) > 0 && len(d) <= 18 && (d[0] != '0' || len(d) == 1)
	var n int64
	for k := 0; plain && k < len(d); k++ {
		c := d[k]
		plain = c >= '0' && c <= '9'
		n = n*10 + int64(c-'0')
	}
	if !plain {
		return parsedWholeNumber(v)
	}
	if len(d) < len(v) {
		n = -n
	}
	return n, true
}

// parsedWholeNumber is rawWholeNumber for a number that is not a plain
// integer: through gjson. Not inlined: gjson.ParseBytes and its result (ten
// words passed by value) would be ~250 bytes of rawWholeNumber, which every
// request with a max_tokens enters.
//
//go:noinline
func parsedWholeNumber(v []byte) (int64, bool) { return snapshot.WholeNumber(gjson.ParseBytes(v)) }

// prompt hashes a completions "prompt" or embeddings "input": a string, an
// array of strings, an array of token ids, or an array of such arrays.
//
// An array may hold hundreds of thousands of small values, so the
// elements are read by loops of their own that enter no function per
// element where they can: one walker call, closure call and hasher call
// per element made a 1 MiB body of [7,8] batches cost 400 times a plain
// text prompt of the same size in Wasm. The hasher gets the ids and texts
// in batches, which hash exactly as the pieces would: consecutive token
// ids, and consecutive texts outside a chat, are concatenated.
func (p *Parser) prompt(v []byte, name string) *Error {
	switch jsonType(v) {
	case gjson.Null:
		return BadRequest(name, "'%s' is required", name)
	case gjson.String:
		if len(v) == 2 {
			return BadRequest(name, "'%s' must not be empty", name)
		}
		p.hasher.Text(p.doc.text(v))
		return nil
	}
	if v[0] != '[' {
		return BadRequest(name, "'%s' must be a string, an array of strings or an array of token ids", name)
	}
	if ids, ok := p.doc.tokens(v); ok {
		// Token ids, or batches of them, that the validating pass has
		// read: hashed from there, no digit read again.
		p.hasher.Tokens(ids)
		return nil
	}
	first := SkipSpace(v, 1)
	if cap(p.ids) < idBatch {
		p.ids = make([]uint32, 0, idBatch)
	}
	p.ids = p.ids[:0]
	var err *Error
	switch c := v[first]; {
	case c == ']':
		return BadRequest(name, "'%s' must not be empty", name)
	case jsonTypeOf[c] == gjson.Number:
		_, err = p.tokenIDs(v, 0, name, -1)
	case c == '"':
		if t, ok := p.doc.texts(v); ok {
			// Strings that the validating pass has read: their text
			// hashed from there (the hasher concatenates texts outside a
			// chat, as texts does).
			p.hasher.Text(unsafeString(t))
			return nil
		}
		return p.texts(v, first, name)
	case c == '[':
		for i, n := first, 0; i < len(v) && v[i] != ']'; n++ {
			if v[i] != '[' || v[SkipSpace(v, i+1)] == ']' {
				return BadRequest(name, "'%s[%d]' must be a non-empty array of token ids", name, n)
			}
			if i, err = p.tokenIDs(v, i, name, n); err != nil {
				return err
			}
			if i = SkipSpace(v, i); i < len(v) && v[i] == ',' {
				i = SkipSpace(v, i+1)
			}
		}
	default:
		return BadRequest(name, "'%s' must be a string, an array of strings or an array of token ids", name)
	}
	if err == nil {
		p.hasher.Tokens(p.ids)
	}
	return err
}

// idBatch is how many token ids the parser gathers before it hands them
// to the hasher.
const idBatch = 256

// tokenIDs gathers into p.ids (handing each full batch to the hasher) the
// token ids of the array that starts at b[i], element outer of the prompt
// name (-1: the prompt itself), and returns the index after the array.
func (p *Parser) tokenIDs(b []byte, i int, name string, outer int) (int, *Error) {
	ids := p.ids // a local: a store into p per id is a write barrier's test in Wasm
	i = SkipSpace(b, i+1)
	for n := 0; i < len(b) && b[i] != ']'; n++ {
		// A plain integer of up to 9 digits followed by a comma or the
		// bracket (nearly every token id) is read here in one pass;
		// anything else goes through skip and rawWholeNumber.
		k, id := i, uint32(0)
		for ; k < len(b) && k-i < 9 && b[k]-'0' <= 9; k++ {
			id = id*10 + uint32(b[k]-'0')
		}
		if k == i || k >= len(b) || (b[k] != ',' && b[k] != ']') {
			k = p.doc.skip(b, i)
			v, ok := int64(0), k > i
			if ok {
				v, ok = rawWholeNumber(b[i:k])
			}
			if !ok || v < 0 || v > maxTokenID {
				p.ids = ids
				return i, tokenIDError(name, outer, n)
			}
			id = uint32(v)
		}
		if len(ids) == cap(ids) {
			p.hasher.Tokens(ids)
			ids = ids[:0]
		}
		ids = append(ids, id)
		if i = SkipSpace(b, k); i < len(b) && b[i] == ',' {
			i = SkipSpace(b, i+1)
		}
	}
	p.ids = ids
	return i + 1, nil
}

// tokenIDError is the error for element n of a token-id array: of the
// prompt name itself (outer -1) or of its element outer.
func tokenIDError(name string, outer, n int) *Error {
	if outer >= 0 {
		name += "[" + strconv.Itoa(outer) + "]"
	}
	return BadRequest(name, "'%s[%d]' must be a token id (a whole number from 0 to %d)", name, n, int64(maxTokenID))
}

// textBatch is how many bytes of consecutive prompt strings the parser
// gathers before it hands them to the hasher as one text.
const textBatch = 4096

// texts hashes the prompt name, an array of strings whose first element
// starts at v[i], as one text (the hasher concatenates texts outside a
// chat): the strings' texts are gathered in p.text, unescaped there, and
// handed over in batches. Each string is found by one word test, its
// table entry, or one scan; a text that needs no unescaping and is longer
// than a batch goes to the hasher as it is.
func (p *Parser) texts(v []byte, i int, name string) *Error {
	buf := p.text[:0]
	for n := 0; i < len(v) && v[i] != ']'; n++ {
		if v[i] != '"' {
			p.text = buf
			return BadRequest(name, "'%s[%d]' must be a string like the first element", name, n)
		}
		e, escaped := shortPlain(v, i), false
		if e < 0 {
			if s, ok := p.doc.nextSpan(v[i:]); ok {
				e, escaped = i+int(s.end-s.start), s.escaped
			} else {
				e, escaped = scanString(v, i, 0)
			}
		}
		inner := v[i+1 : e-1]
		switch {
		case escaped:
			buf = appendUnescaped(buf, inner)
		case len(inner) > textBatch:
			p.hasher.Text(unsafeString(buf))
			p.hasher.Text(unsafeString(inner))
			buf = buf[:0]
		default:
			buf = append(buf, inner...)
		}
		if len(buf) >= textBatch {
			p.hasher.Text(unsafeString(buf))
			buf = buf[:0]
		}
		if i = SkipSpace(v, e); i < len(v) && v[i] == ',' {
			i = SkipSpace(v, i+1)
		}
	}
	// Always, even empty: an array of empty strings is a text prompt too.
	p.hasher.Text(unsafeString(buf))
	p.text = buf
	return nil
}

// chat hashes the body's tools and messages (fields are its top-level
// members, see parse) in request order, as a chat template lays them out.
// Each message is read here rather than in a function of its own: in Wasm
// each function a request enters, and each call, costs.
func (p *Parser) chat(fields *[firstClientOnly][]byte) *Error {
	msgs := fields[fieldMessages]
	if tools := fields[fieldTools]; tools != nil && jsonType(tools) != gjson.Null {
		if err := p.tools(tools); err != nil {
			return err
		}
	}
	if msgs == nil {
		return errNoMessages
	}
	if msgs[0] != '[' {
		return errBadMessages
	}
	n := 0
	for i := SkipSpace(msgs, 1); i < len(msgs) && msgs[i] != ']'; n++ {
		if msgs[i] != '{' {
			return messageError(n, messageNotObject)
		}
		// One pass over the message's members (the content may be most
		// of the body), from its opening brace to its closing one: the
		// message is not first stepped over to find its end (its table
		// entry, if any, is passed by).
		var msg [len(messageFields)]valueSpan // its members, by index in messageFields
		end, plain, _ := p.doc.object(msgs, i, messageKeys, msg[:])
		if end < 0 {
			return errBodyNotJSON // not reached: the body is valid
		}
		if i = SkipSpace(msgs, end); i < len(msgs) && msgs[i] == ',' {
			i = SkipSpace(msgs, i+1)
		}
		role, content := msg[messageRole].in(msgs), msg[messageContent].in(msgs)
		if jsonType(role) != gjson.String || len(role) == 2 {
			return messageError(n, messageBadRole)
		}
		if msg[messageName].e|msg[messageToolCalls].e|msg[messageToolCallID].e == 0 && jsonType(content) == gjson.String {
			p.hasher.Message(p.doc.str(role, plain>>messageRole&1 != 0), p.doc.str(content, plain>>messageContent&1 != 0))
			continue
		}
		p.hasher.BeginMessage(p.doc.str(role, plain>>messageRole&1 != 0))
		if err := p.messageRest(msgs, &msg, plain, n); err != nil {
			return err
		}
	}
	if n == 0 {
		return errEmptyMessages
	}
	return nil
}

// tools hashes the body's "tools", a value other than null. Out of chat:
// few requests send tools.
func (p *Parser) tools(tools []byte) *Error {
	if tools[0] != '[' {
		return errBadTools
	}
	p.hasher.Field("tools", unsafeString(tools))
	return nil
}

// The members of a message that chat reads, by index in messageFields:
// as written (an escaped key is not one of them).
const (
	messageRole = iota
	messageName
	messageContent
	messageToolCalls
	messageToolCallID
)

var messageFields = [...]string{
	messageRole:       "role",
	messageName:       "name",
	messageContent:    "content",
	messageToolCalls:  "tool_calls",
	messageToolCallID: "tool_call_id",
}

// The key sets object reads objects of each kind for: the request's
// members (by their decoded names, the last of a name winning, as Python's
// json module reads them), a message's (as written), a content part's
// (type and text as written, the first image_url and input_audio by
// decoded name, as gjson finds them), and the first member of each name,
// decoded, of a tool call, its function and an image or audio part's
// object.
var (
	requestKeys  = newKeySet(requestFields[:], requestFields[:], nil)
	messageKeys  = newKeySet(messageFields[:], nil, nil)
	partKeys     = newKeySet(partFields[:], partFields[partImage:], partFields[partImage:])
	callKeys     = lookupKeys("id", "function")
	functionKeys = lookupKeys("name", "arguments")
	urlKeys      = lookupKeys("url")
	dataKeys     = lookupKeys("data")
	// partValueKeys is the key set of the object a part of each type with
	// one holds under its type's name (partFields).
	partValueKeys = [len(partFields)]*keySet{partImage: urlKeys, partAudio: dataKeys}
)

// lookupKeys is the key set of names read as gjson's Get finds a member:
// the first of each name, by its decoded key.
func lookupKeys(names ...string) *keySet { return newKeySet(names, names, names) }

// The members of a content part that part reads, by index in partFields.
const (
	partType = iota
	partText
	partImage
	partAudio
)

var partFields = [...]string{partType: "type", partText: "text", partImage: "image_url", partAudio: "input_audio"}

// streamUsage reports which of stream_options' usage members are true:
// include_usage (one usage chunk at the end, usageAtEnd) and vLLM's
// continuous_usage_stats (usage in every chunk, usageContinuous). Other
// members and types are the engine's to judge. Out of parse's line
// (noinline): few requests carry stream_options, and each function entered
// costs a request (docs/performance.md).
//
//go:noinline
func (p *Parser) streamUsage(obj []byte) (u uint8) {
	for i := SkipSpace(obj, 1); ; {
		k, v, next, ok := p.doc.member(obj, i)
		if !ok {
			return u
		}
		i = next
		if f := fieldOf(p.doc.text(k), streamUsageFields[:]); f >= 0 && jsonType(v) == gjson.True {
			u |= 1 << f
		}
	}
}

// streamUsageFields are the stream_options members that put usage in a
// stream, in the order of their bits.
var streamUsageFields = [...]string{"include_usage", "continuous_usage_stats"}

const (
	usageAtEnd      = 1 << 0
	usageContinuous = 1 << 1
)

// messageRest is chat's reading of message i after the role, for a message
// that is more than a role and a string content: a name, content parts, tool
// calls (fields: where object found its members in msgs). Out of chat: each function entered costs a request
// (docs/performance.md), and most messages are a role and a string.
func (p *Parser) messageRest(msgs []byte, fields *[len(messageFields)]valueSpan, plain uint64, i int) *Error {
	name, content := fields[messageName].in(msgs), fields[messageContent].in(msgs)
	calls, callID := fields[messageToolCalls].in(msgs), fields[messageToolCallID].in(msgs)
	if jsonType(name) == gjson.String {
		p.hasher.Field("name", p.doc.str(name, plain>>messageName&1 != 0))
	}
	switch {
	case jsonType(content) == gjson.String:
		p.hasher.Text(p.doc.str(content, plain>>messageContent&1 != 0))
	case len(content) > 0 && content[0] == '[':
		if err := p.parts(content, i); err != nil {
			return err
		}
	case jsonType(content) == gjson.Null:
		// Absent or null: an assistant message with tool calls, or a refusal.
	default:
		return messageError(i, messageBadContent)
	}
	if jsonType(calls) != gjson.Null {
		if calls[0] != '[' {
			return messageError(i, messageBadToolCalls)
		}
		p.toolCalls(calls)
	}
	if jsonType(callID) == gjson.String {
		p.hasher.Field("tool_call_id", p.doc.str(callID, plain>>messageToolCallID&1 != 0))
	}
	return nil
}

// The ways a message can be wrong, by index in messageFaults: the field
// at fault (".role"; "" for the message itself) and the error's format,
// which names the message with its one %s.
const (
	messageNotObject = iota
	messageBadRole
	messageBadContent
	messageBadToolCalls
)

var messageFaults = [...]struct{ field, format string }{
	messageNotObject:    {"", "'%s' must be an object with 'role' and 'content'"},
	messageBadRole:      {".role", "'%s.role' must be a non-empty string"},
	messageBadContent:   {".content", "'%s.content' must be a string or an array of content parts"},
	messageBadToolCalls: {".tool_calls", "'%s.tool_calls' must be an array"},
}

// messageError is the error of kind fault (see messageFaults) about message i.
// Errors are built out of line, here and in partError, and chat names each by
// a small number: each function entered costs a request (docs/performance.md),
// and chat reads every message.
func messageError(i, fault int) *Error {
	f := messageFaults[fault]
	at := "messages[" + strconv.Itoa(i) + "]"
	return BadRequest(at+f.field, f.format, at)
}

// toolCalls hashes an assistant message's tool calls, the array calls,
// each read in place with the span walker (object, valueString): gjson's
// Array of a ParseBytes copy made a body of many tool calls allocate 9 MB
// per MiB, and gjson's lookups scan each call byte by byte and copy every
// escaped string (arguments are JSON text, full of escaped quotes).
func (p *Parser) toolCalls(calls []byte) {
	for i := SkipSpace(calls, 1); i < len(calls) && calls[i] != ']'; {
		// A call is read from its opening brace to its closing one (not
		// first stepped over); anything else is stepped over and hashes
		// as a call of empty strings.
		var call [2]valueSpan
		var cp uint64
		end := -1
		if calls[i] == '{' {
			end, cp, _ = p.doc.object(calls, i, callKeys, call[:])
		} else if _, next, ok := p.doc.element(calls, i); ok {
			end = next
		}
		if end < 0 {
			return // not reached: the body is valid
		}
		if i = SkipSpace(calls, end); i < len(calls) && calls[i] == ',' {
			i = SkipSpace(calls, i+1)
		}
		var fn [2]valueSpan
		f := call[1].in(calls)
		fp := p.doc.lookup(f, functionKeys, fn[:])
		p.hasher.ToolCall(p.valueString(call[0].in(calls), cp&1 != 0), p.valueString(fn[0].in(f), fp&1 != 0), p.valueString(fn[1].in(f), fp&2 != 0))
	}
}

// valueString is gjson's Result.String of the raw value v ("" for none,
// an empty v): a string's text read by the doc (no copy; plain as object
// reports it), anything else through gjson.
func (p *Parser) valueString(v []byte, plain bool) string {
	if plain { // small enough to be inlined: a plain string's text is its bytes
		return unsafe.String(&v[1], len(v)-2)
	}
	return p.anyString(v)
}

// anyString is valueString of a value that is not a plain string.
func (p *Parser) anyString(v []byte) string {
	switch {
	case len(v) == 0:
		return ""
	case v[0] == '"':
		return p.doc.text(v)
	}
	return gjson.Parse(unsafeString(v)).String()
}

// parts hashes the content parts of message i, the array content. One
// call per message, each part read in its loop: a call per part cost a
// body of many small parts more than the reading of their members.
func (p *Parser) parts(content []byte, i int) *Error {
	for at, j := SkipSpace(content, 1), 0; at < len(content) && content[at] != ']'; j++ {
		if content[at] != '{' {
			return partError(i, j, "", "'%s' must be a content part object")
		}
		// One walk of the part's members (object), from its opening
		// brace to its closing one (not first stepped over to find its
		// end), finds type and text by their keys as written and the
		// first image_url and input_audio as gjson finds a member, by its
		// decoded key (partKeys). Walking the part again for them
		// whenever it held an escaped key made parts with one cost 160
		// times plain text.
		var f [len(partFields)]valueSpan
		end, plain, _ := p.doc.object(content, at, partKeys, f[:])
		if end < 0 {
			return errBodyNotJSON // not reached: the body is valid
		}
		typ, text := f[partType].in(content), f[partText].in(content)
		if jsonType(typ) != gjson.String {
			return partError(i, j, ".type", "'%s.type' must be a string")
		}
		t := p.doc.str(typ, plain>>partType&1 != 0)
		switch k := partKind(t); k {
		case partText:
			if jsonType(text) != gjson.String {
				return partError(i, j, ".text", "'%s.text' must be a string")
			}
			p.hasher.Text(p.doc.str(text, plain>>partText&1 != 0))
		case partImage, partAudio:
			// The object under the type's name, read for its one member
			// (url, data) as gjson's Get finds it.
			var v [1]valueSpan
			obj := f[k].in(content)
			vp := p.doc.lookup(obj, partValueKeys[k], v[:])
			p.hasher.Part(partFields[k], p.valueString(v[0].in(obj), vp&1 != 0))
		default:
			// Other part types shape the prompt too: hash them whole.
			p.hasher.Part(t, unsafeString(content[at:end]))
		}
		if at = SkipSpace(content, end); at < len(content) && content[at] == ',' {
			at = SkipSpace(content, at+1)
		}
	}
	return nil
}

// partKind returns the part type t names, as the index in partFields of
// the member that holds its value (partText, partImage, partAudio), or -1
// for another type. Compared by length and at most two words: a string
// comparison (==, switch) longer than 8 bytes is a call to the runtime's
// memequal in Wasm.
func partKind(t string) int {
	k := -1
	switch {
	case len(t) == 4 && t == "text":
		k = partText
	case len(t) == 9 && t[:8] == "image_ur" && t[8] == 'l':
		k = partImage
	case len(t) == 11 && t[:8] == "input_au" && t[8:] == "dio":
		k = partAudio
	}
	return k
}

// partError is messageError for content part j of message i.
func partError(i, j int, field, format string) *Error {
	at := "messages[" + strconv.Itoa(i) + "].content[" + strconv.Itoa(j) + "]"
	return BadRequest(at+field, format, at)
}

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }
