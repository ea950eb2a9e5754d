// Package openaitest holds request bodies for tests and benchmarks of the
// OpenAI request parser, shared by the parser's own tests (openai) and the
// Wasm host's (filter): the body shapes whose many small JSON values cost
// the parser the most per byte.
package openaitest

import (
	"strconv"
	"strings"
)

// Shape is one way of filling a request body of a given size: the
// plain-text prompt every other shape is compared with, and the shapes
// whose many small values made the parser's cost per byte hundreds of
// times that of plain text.
type Shape struct {
	Name string
	Path string
	// body returns a body of about n bytes; i varies it (a question
	// number) so that consecutive requests are not identical.
	Body func(n, i int) string
}

// Refused reports whether kvroute answers a body of this shape of 256 KiB
// or more with a 400 rather than routing it: more top-level members than
// it reads, or objects holding more members than its read budget lets it
// read (see openai's readBudget). Its benchmarks then measure the cost of
// the refusal.
func (s Shape) Refused() bool { return refused[s.Name] }

var refused = map[string]bool{"unused-keys": true, "escaped-non-ascii-keys": true, "escaped-letter-keys": true, "unused-keys-in-message": true}

// Fill returns head, then unit repeated (with sep between) until the body
// is about n bytes, then tail.
func Fill(n int, head, unit, sep, tail string) string {
	var b strings.Builder
	b.Grow(n + len(tail) + len(unit))
	b.WriteString(head)
	for k := 0; b.Len()+len(unit)+len(tail) < n; k++ {
		if k > 0 {
			b.WriteString(sep)
		}
		b.WriteString(unit)
	}
	b.WriteString(tail)
	return b.String()
}

// Shapes are the shapes the parser's benchmarks and allocation test
// (openai) and the Wasm host's benchmark (filter.BenchmarkBodyShapesInWasm)
// measure; the first, plain text, is the baseline.
var Shapes = []Shape{
	{"text", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":"`+strconv.Itoa(i)+` `, "You are a careful assistant.", " ", `"}`)
	}},
	{"token-batches", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":[[`+strconv.Itoa(i+1)+`,1],`, "[7,8]", ",", `]}`)
	}},
	{"tokens", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":[`+strconv.Itoa(i+1)+`,`, "7", ",", `]}`)
	}},
	// Batches of token id 0, and with a space inside each batch: a batch
	// that does not start with a digit 1-9 went through the validator's
	// general path. (json.dumps writes spaces between values, not inside
	// brackets: see the dumps shapes.)
	{"zero-id-batches", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":[[`+strconv.Itoa(i+1)+`],`, "[0]", ",", `]}`)
	}},
	{"spaced-id-batches", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":[[`+strconv.Itoa(i+1)+`],`, "[ 0]", ", ", `]}`)
	}},
	{"string-batches", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":["`+strconv.Itoa(i)+`",`, `"ab"`, ",", `]}`)
	}},
	// Batches of short strings other than ASCII: stringArray read such
	// strings by scanString, one call per string.
	{"non-ascii-string-batches", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":["`+strconv.Itoa(i)+`",`, `"é"`, ",", `]}`)
	}},
	{"tiny-messages", "/v1/chat/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","messages":[{"role":"user","content":"`+strconv.Itoa(i)+`"},`, `{"role":"user","content":"hi"}`, ",", `]}`)
	}},
	{"tiny-parts", "/v1/chat/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"`+strconv.Itoa(i)+`"},`,
			`{"type":"text","text":"hi"}`, ",", `]}]}`)
	}},
	{"image-parts", "/v1/chat/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"`+strconv.Itoa(i)+`"},`,
			`{"type":"image_url","image_url":{"url":"u"}}`, ",", `]}]}`)
	}},
	{"tool-calls", "/v1/chat/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","messages":[{"role":"user","content":"`+strconv.Itoa(i)+`"},{"role":"assistant","tool_calls":[`,
			`{"id":"c","function":{"name":"f","arguments":"{}"}}`, ",", `]}]}`)
	}},
	{"unused-keys", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":"`+strconv.Itoa(i)+`",`, `"k":0`, ",", `}`)
	}},
	// Unused keys with text other than ASCII and an escape: a key that
	// may name one of the parser's members when decoded is decoded, and
	// this one never can.
	{"escaped-non-ascii-keys", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":"`+strconv.Itoa(i)+`",`, `"日\u00e9 ": ""`, ",", `}`)
	}},
	{"unused-keys-in-message", "/v1/chat/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","messages":[{"role":"user","content":"`+strconv.Itoa(i)+`",`, `"k":0`, ",", `}]}`)
	}},
	{"unused-containers", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":"`+strconv.Itoa(i)+`","x":[`, `{"a":[]}`, ",", `]}`)
	}},
	// Brackets: arrays nested eight deep, each a container of its own
	// (the token-id and string fast paths take none of them).
	{"nested-arrays", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":"`+strconv.Itoa(i)+`","x":[`, `[[[[[[[[0]]]]]]]]`, ",", `]}`)
	}},
	{"escapes", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":"`+strconv.Itoa(i), `\n`, "", `"}`)
	}},
	{"escaped-batches", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":["`+strconv.Itoa(i)+`",`, `"\n"`, ",", `]}`)
	}},
	// Image parts whose URL holds an escape and non-ASCII text: the
	// costliest unit an earlier search found.
	{"escaped-image-parts", "/v1/chat/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"`+strconv.Itoa(i)+`"},`,
			`{"type":"image_url","image_url":{"url":"\n日"}}`, ",", `]}]}`)
	}},
	// searched-worst is the costliest unit TestBodyShapeSearch found and
	// BenchmarkBodyShapesInWasm confirmed among the search's top
	// candidates: text parts with an escaped text and an unused key that
	// holds an escape and non-ASCII text.
	{"searched-worst", "/v1/chat/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"`+strconv.Itoa(i)+`"},`,
			`{"text":"\\","type":"text","\né":{}}`, ",", `]}]}`)
	}},
	// Unused members whose keys spell letters with \u escapes, and
	// string batches of non-ASCII text with an escape: the costliest units
	// of the search after the shapes above were made cheap.
	{"escaped-letter-keys", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":"`+strconv.Itoa(i)+`",`, `"a\u0062":""`, ",", `}`)
	}},
	{"escaped-non-ascii-string-batches", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":["`+strconv.Itoa(i)+`",`, `"éé\t"`, ",", `]}`)
	}},
	// Text parts whose texts and a repeated type are surrogate pairs
	// ("\ud83d\ude00"): the costliest unit of the search in the Wasm host
	// once the string batches below were made cheap.
	{"surrogate-pair-parts", "/v1/chat/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"`+strconv.Itoa(i)+`"},`,
			`{"text":"\ud83d\ude00a","type":"text","type":"\ud83d\ude00"}`, ",", `]}]}`)
	}},
	// String batches the search ranked first once the spaced ones were
	// cheap: an escape before 2- and 3-byte characters, and \u escapes
	// after a tab.
	{"escaped-cjk-string-batches", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":["`+strconv.Itoa(i)+`",`, `"\"é日"`, ",", `]}`)
	}},
	{"tabbed-u-escape-batches", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model":"m","prompt":["`+strconv.Itoa(i)+`",`, "\t"+`"\\\u00e9\n"`, ",", `]}`)
	}},
	// Prompts as Python's json.dumps writes them by default, with a space
	// after each comma and colon (the spelling of clients built on
	// requests or aiohttp): realistic token ids and batches of them,
	// string batches (also of escapes: the costliest unit of a search that
	// ran after the others were made cheap) and tiny messages.
	{"dumps-tokens", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model": "m", "prompt": [`+strconv.Itoa(i+1)+`, `, "12345", ", ", `]}`)
	}},
	{"dumps-token-batches", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model": "m", "prompt": [[`+strconv.Itoa(i+1)+`, 1], `, "[1234, 5678]", ", ", `]}`)
	}},
	{"dumps-string-batches", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model": "m", "prompt": ["`+strconv.Itoa(i)+`", `, `"ab"`, ", ", `]}`)
	}},
	{"dumps-escaped-batches", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model": "m", "prompt": ["`+strconv.Itoa(i)+`", `, `"\n"`, ", ", `]}`)
	}},
	{"dumps-messages", "/v1/chat/completions", func(n, i int) string {
		return Fill(n, `{"model": "m", "messages": [{"role": "user", "content": "`+strconv.Itoa(i)+`"}, `, `{"role": "user", "content": "hi"}`, ", ", `]}`)
	}},
	// Chat as such clients send it: Python's json.dumps escapes every
	// character other than ASCII as \u by default (ensure_ascii), so a
	// prompt in Chinese arrives six bytes of escape per character; and
	// answers of a few lines, each line ending in an escaped newline.
	{"dumps-cjk-text", "/v1/completions", func(n, i int) string {
		return Fill(n, `{"model": "m", "prompt": "`+strconv.Itoa(i)+` `, `\u4f60\u597d\uff0c\u8bf7\u95ee`, " ", `"}`)
	}},
	{"dumps-cjk-messages", "/v1/chat/completions", func(n, i int) string {
		return Fill(n, `{"model": "m", "messages": [{"role": "user", "content": "`+strconv.Itoa(i)+`"}, `,
			`{"role": "user", "content": "`+strings.Repeat(`\u4f60\u597d\uff0c\u8bf7\u95ee `, 8)+`"}`, ", ", `]}`)
	}},
	{"dumps-chat", "/v1/chat/completions", func(n, i int) string {
		return Fill(n, `{"model": "m", "messages": [{"role": "user", "content": "`+strconv.Itoa(i)+`"}, `,
			`{"role": "assistant", "content": "`+strings.Repeat(`Sure, here is the answer.\n`, 8)+`"}`, ", ", `]}`)
	}},
	// Agent loops, as json.dumps writes them: turns of an assistant
	// message that calls a tool (its arguments JSON in a string, every
	// quote escaped) and the tool's answer (JSON in a string too), and
	// the tool definitions (JSON schemas: small nested objects) every
	// request of such a loop carries.
	{"agent-turns", "/v1/chat/completions", func(n, i int) string {
		return Fill(n, `{"model": "m", "messages": [{"role": "user", "content": "`+strconv.Itoa(i)+`"}, `,
			`{"role": "assistant", "content": null, "tool_calls": [{"id": "call_8f2a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]}, {"role": "tool", "tool_call_id": "call_8f2a", "content": "{\"temperature\": 21, \"sky\": \"clear\", \"wind_kmh\": 12}"}`, ", ", `]}`)
	}},
	{"tool-schemas", "/v1/chat/completions", func(n, i int) string {
		return Fill(n, `{"model": "m", "messages": [{"role": "user", "content": "`+strconv.Itoa(i)+`"}], "tools": [`,
			`{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a given city.", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}`, ", ", `]}`)
	}},
}
