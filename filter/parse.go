package filter

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/filter/config"
	"github.com/kvroute/kvroute/index"
)

// Request parsing reads the few fields routing needs straight out of the
// body with gjson: no full unmarshal, no copy of the prompt beyond what the
// hasher consumes, and prompt text never leaves this file except as block
// hashes.

// apiKind is the OpenAI endpoint a path addresses.
type apiKind uint8

const (
	apiCompletions apiKind = iota
	apiChat
	apiEmbeddings
	apiUnknown // a configured inference path with another suffix: sniff the body
)

func kindOf(path string) apiKind {
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return apiChat
	case strings.HasSuffix(path, "/completions"):
		return apiCompletions
	case strings.HasSuffix(path, "/embeddings"):
		return apiEmbeddings
	}
	return apiUnknown
}

// parsedRequest is what routing needs from one body. No prompt text.
type parsedRequest struct {
	Model, Adapter string
	SessionKey     string // the body's "user"
	Stream         bool
	MaxTokens      int
	PromptTokens   int
}

// requestError is a client error: the filter answers it locally with an
// OpenAI-style body, and the request never reaches an engine.
type requestError struct {
	Status  int
	Param   string // the offending field, "" for the body as a whole
	Message string
}

func badRequest(param, format string, args ...any) *requestError {
	msg := format
	if len(args) > 0 {
		msg = sprintf(format, args...)
	}
	return &requestError{Status: 400, Param: param, Message: msg}
}

// body renders the OpenAI error object.
func (e *requestError) body() []byte {
	typ := "invalid_request_error"
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
	b = strconv.AppendInt(b, int64(e.Status), 10)
	return append(b, "}}"...)
}

// Bounds on numbers a client may send.
const (
	maxMaxTokens = 1 << 24
	maxTokenID   = 1<<32 - 1
)

// requestParser parses bodies into a hasher; one per VM, reused.
type requestParser struct {
	cfg    *config.Config
	hasher *index.Hasher
	ids    []uint32
}

// parse validates body for kind and feeds its prompt to the hasher.
func (p *requestParser) parse(body []byte, kind apiKind) (parsedRequest, *requestError) {
	var r parsedRequest
	if len(body) == 0 {
		return r, badRequest("", "the request body is empty: send a JSON object with \"model\" and a prompt")
	}
	if !utf8.Valid(body) {
		return r, badRequest("", "the request body is not valid UTF-8")
	}
	if !validJSON(body) {
		return r, badRequest("", "the request body is not valid JSON")
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return r, badRequest("", "the request body must be a JSON object")
	}
	// One pass over the top-level keys: a Get per field would rescan the
	// whole body (prompt included) for every key that is absent or comes
	// after the prompt. A repeated key keeps its last value, as Python's
	// json module (vLLM, SGLang) does.
	var model, stream, maxTokens, maxCompletion, user, salt, messages, tools, prompt, input gjson.Result
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "model":
			model = v
		case "stream":
			stream = v
		case "max_tokens":
			maxTokens = v
		case "max_completion_tokens":
			maxCompletion = v
		case "user":
			user = v
		case "cache_salt":
			salt = v
		case "messages":
			messages = v
		case "tools":
			tools = v
		case "prompt":
			prompt = v
		case "input":
			input = v
		}
		return true
	})
	if !model.Exists() {
		return r, badRequest("model", "'model' is required")
	}
	if model.Type != gjson.String || model.Str == "" {
		return r, badRequest("model", "'model' must be a non-empty string")
	}
	r.Model = model.Str
	if base, ok := p.cfg.LoRAAdapters[r.Model]; ok {
		r.Model, r.Adapter = base, model.Str
	}
	if stream.Exists() {
		if stream.Type != gjson.True && stream.Type != gjson.False {
			return r, badRequest("stream", "'stream' must be a boolean")
		}
		r.Stream = stream.Bool()
	}
	for _, f := range [...]struct {
		name string
		v    gjson.Result
	}{{"max_tokens", maxTokens}, {"max_completion_tokens", maxCompletion}} {
		if !f.v.Exists() || f.v.Type == gjson.Null {
			continue
		}
		n, ok := wholeNumber(f.v)
		if !ok || n < 0 || n > maxMaxTokens {
			return r, badRequest(f.name, "'%s' must be a whole number from 0 to %d", f.name, maxMaxTokens)
		}
		r.MaxTokens = int(n)
	}
	if user.Exists() && user.Type != gjson.Null {
		if user.Type != gjson.String {
			return r, badRequest("user", "'user' must be a string")
		}
		r.SessionKey = user.Str
	}
	if salt.Exists() && salt.Type != gjson.String {
		return r, badRequest("cache_salt", "'cache_salt' must be a string")
	}

	p.hasher.Reset(r.Model, r.Adapter, salt.Str)
	if kind == apiUnknown {
		switch {
		case messages.Exists():
			kind = apiChat
		case prompt.Exists():
			kind = apiCompletions
		case input.Exists():
			kind = apiEmbeddings
		default:
			return r, badRequest("", "the body has no 'messages', 'prompt' or 'input'")
		}
	}
	var err *requestError
	switch kind {
	case apiChat:
		err = p.chat(messages, tools)
	case apiCompletions:
		err = p.prompt(prompt, "prompt")
	case apiEmbeddings:
		err = p.prompt(input, "input")
	}
	if err != nil {
		return r, err
	}
	r.PromptTokens = p.hasher.PromptTokens()
	return r, nil
}

// wholeNumber reads a JSON integer (1e3 and 2.0 are accepted as whole).
func wholeNumber(v gjson.Result) (int64, bool) {
	if v.Type != gjson.Number {
		return 0, false
	}
	if n, err := strconv.ParseInt(v.Raw, 10, 64); err == nil {
		return n, true
	}
	f := v.Num
	if f != float64(int64(f)) {
		return 0, false
	}
	return int64(f), true
}

// prompt hashes a completions "prompt" or embeddings "input": a string, an
// array of strings, an array of token ids, or an array of such arrays.
func (p *requestParser) prompt(v gjson.Result, name string) *requestError {
	switch {
	case !v.Exists() || v.Type == gjson.Null:
		return badRequest(name, "'%s' is required", name)
	case v.Type == gjson.String:
		if v.Str == "" {
			return badRequest(name, "'%s' must not be empty", name)
		}
		p.hasher.Text(v.Str)
		return nil
	case !v.IsArray():
		return badRequest(name, "'%s' must be a string, an array of strings or an array of token ids", name)
	}
	items := v.Array()
	if len(items) == 0 {
		return badRequest(name, "'%s' must not be empty", name)
	}
	switch {
	case items[0].Type == gjson.Number:
		return p.tokenIDs(items, name)
	case items[0].Type == gjson.String:
		for i, it := range items {
			if it.Type != gjson.String {
				return badRequest(name, "'%s[%d]' must be a string like the first element", name, i)
			}
			p.hasher.Text(it.Str)
		}
		return nil
	case items[0].IsArray():
		for i, it := range items {
			sub := it.Array()
			if !it.IsArray() || len(sub) == 0 {
				return badRequest(name, "'%s[%d]' must be a non-empty array of token ids", name, i)
			}
			if err := p.tokenIDs(sub, name+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		return nil
	}
	return badRequest(name, "'%s' must be a string, an array of strings or an array of token ids", name)
}

func (p *requestParser) tokenIDs(items []gjson.Result, name string) *requestError {
	p.ids = p.ids[:0]
	for i, it := range items {
		n, ok := wholeNumber(it)
		if !ok || n < 0 || n > maxTokenID {
			return badRequest(name, "'%s[%d]' must be a token id (a whole number from 0 to %d)", name, i, int64(maxTokenID))
		}
		p.ids = append(p.ids, uint32(n))
	}
	p.hasher.Tokens(p.ids)
	return nil
}

// chat hashes tools and messages in request order, as a chat template lays
// them out.
func (p *requestParser) chat(msgs, tools gjson.Result) *requestError {
	if tools.Exists() && tools.Type != gjson.Null {
		if !tools.IsArray() {
			return badRequest("tools", "'tools' must be an array")
		}
		p.hasher.Field("tools", tools.Raw)
	}
	if !msgs.Exists() {
		return badRequest("messages", "'messages' is required")
	}
	if !msgs.IsArray() {
		return badRequest("messages", "'messages' must be an array of message objects")
	}
	var err *requestError
	n := 0
	msgs.ForEach(func(_, m gjson.Result) bool {
		err = p.message(m, n)
		n++
		return err == nil
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return badRequest("messages", "'messages' must not be empty")
	}
	return nil
}

func (p *requestParser) message(m gjson.Result, i int) *requestError {
	at := "messages[" + strconv.Itoa(i) + "]"
	if !m.IsObject() {
		return badRequest(at, "'%s' must be an object with 'role' and 'content'", at)
	}
	// One pass over the message's keys (a Get per key would rescan the
	// content, which may be most of the body).
	var role, name, content, calls, callID gjson.Result
	m.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "role":
			role = v
		case "name":
			name = v
		case "content":
			content = v
		case "tool_calls":
			calls = v
		case "tool_call_id":
			callID = v
		}
		return true
	})
	if role.Type != gjson.String || role.Str == "" {
		return badRequest(at+".role", "'%s.role' must be a non-empty string", at)
	}
	p.hasher.BeginMessage(role.Str)
	if name.Type == gjson.String {
		p.hasher.Field("name", name.Str)
	}
	switch {
	case content.Type == gjson.String:
		p.hasher.Text(content.Str)
	case content.IsArray():
		var err *requestError
		j := 0
		content.ForEach(func(_, part gjson.Result) bool {
			err = p.part(part, at+".content["+strconv.Itoa(j)+"]")
			j++
			return err == nil
		})
		if err != nil {
			return err
		}
	case !content.Exists() || content.Type == gjson.Null:
		// An assistant message with tool calls, or a refusal: no content.
	default:
		return badRequest(at+".content", "'%s.content' must be a string or an array of content parts", at)
	}
	if calls.Exists() && calls.Type != gjson.Null {
		if !calls.IsArray() {
			return badRequest(at+".tool_calls", "'%s.tool_calls' must be an array", at)
		}
		for _, c := range calls.Array() {
			fn := c.Get("function")
			p.hasher.ToolCall(c.Get("id").String(), fn.Get("name").String(), fn.Get("arguments").String())
		}
	}
	if callID.Type == gjson.String {
		p.hasher.Field("tool_call_id", callID.Str)
	}
	return nil
}

func (p *requestParser) part(part gjson.Result, at string) *requestError {
	if !part.IsObject() {
		return badRequest(at, "'%s' must be a content part object", at)
	}
	typ := part.Get("type")
	if typ.Type != gjson.String {
		return badRequest(at+".type", "'%s.type' must be a string", at)
	}
	switch typ.Str {
	case "text":
		text := part.Get("text")
		if text.Type != gjson.String {
			return badRequest(at+".text", "'%s.text' must be a string", at)
		}
		p.hasher.Text(text.Str)
	case "image_url":
		p.hasher.Part("image_url", part.Get("image_url.url").String())
	case "input_audio":
		p.hasher.Part("input_audio", part.Get("input_audio.data").String())
	default:
		// Other part types shape the prompt too: hash them whole.
		p.hasher.Part(typ.Str, part.Raw)
	}
	return nil
}

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }
