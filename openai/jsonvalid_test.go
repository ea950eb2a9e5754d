package openai

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

var jsonCases = append([]string{
	`{}`, `[]`, `""`, `0`, `-0`, `1.5e-3`, `true`, `false`, `null`, ` {"a" : [1, 2.0, -3e+2, "x\"\\\/\b\f\n\r\t\u00e9", true, false, null, {}, []]} `,
	`{"a":{"b":{"c":[[[]]]}}}`, `[1,[2,[3]]]`, `{"a":1,"b":2}`, "\"\xff\"",
	// invalid
	``, ` `, `{`, `}`, `[`, `]`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[,1]`, `{,}`, `{"a" 1}`, `{a:1}`, `'a'`,
	`01`, `1.`, `.1`, `1e`, `1e+`, `-`, `+1`, `tru`, `nul`, `falsee`, `"abc`, `"\x"`, `"\u12"`, `"\u12g4"`, "\"a\tb\"",
	`{"a":1}{}`, `[1] 2`, `{"a":[1}`, `[{"a":1]}`, `{"a":1,"b"}`, `"\`, `[1 2]`, `{"a":1 "b":2}`, `NaN`, `Infinity`,
	`{"model":"m","prompt":"hel`,
	"\"caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80\"", "{\"\xff\":1}", "\"\xc3\"", "\"\xed\xa0\x80\"", "[\"ok\", \xc3\xa9]",
	"\"" + strings.Repeat("\xe4\xb8\xad", 40) + "\xe4\xb8\"", "\"" + strings.Repeat("abcdefgh", 9) + "\xff" + strings.Repeat("x", 40) + "\"",
	// runs of integers in arrays (the validator's token-id loop)
	`[1,2,3]`, `[12,345,6789,0,10]`, `[1,2.5,3]`, `[1,2e3,4]`, `[1,2E-3]`, `[1, 2 ,3]`, `{"p":[7,8,9],"q":1}`, `[[1,2],[3,4]]`,
	// arrays of plain integers (the validator's intArray), short and longer than a table entry
	`[7]`, `[7,8]`, `[[7,8],[9]]`, `{"p":[[7,8],[9]],"q":[1,2]}`, `[12,0]`, `[1,-2]`, `[1,2 ]`, `[1 ,2]`, `[1,2,]]`, `[1,2`, `[1,2]]`,
	"[" + strings.Repeat("12345,", 20) + "6]", "{\"p\":[" + strings.Repeat("7,", 40) + "8],\"q\":\"" + strings.Repeat("x", 70) + "\"}",
	`[1,01]`, `[1,2,]`, `[1,2x]`, `[1,2.]`, `[1,2e]`, `[1,2,-]`, `[1,23`, `{"a":1,2}`, `[1,2}`,
	`[[1,],[1]]`, `[[7,8],[1,]]`, `[[1,2],[]]`, `[[],[3]]`, // a trailing comma in a batch is no empty batch
	"[[" + strings.Repeat("1,22],[333,4444444],[", 20) + "1],[2,],[3]]", "[[" + strings.Repeat("1,22],[333,4444444],[", 20) + "1],[2],[3],]",
	"[[" + strings.Repeat("1,22],[333,4444444],[", 20) + "1],[2],[3]]", "[[" + strings.Repeat("1,22],[333,4444444],[", 20) + "1],[0],[3]]",
	"[[" + strings.Repeat("12345678,22],[", 20) + "1]]", "[[" + strings.Repeat("1,22],[333,4444444],[", 20) + "1]],[3]]",
	// token id 0 and whitespace in arrays of integers and their batches
	// (intArrays reads both), short and long, with leading zeros and
	// other numbers that are not ids among them
	`[0]`, `[0,0]`, `[[0],[0]]`, `[[1],[0],[ 0],[0 ],[ 0 , 7 ]]`, `[ 1 , 0 ]`, `[[0,01]]`, `[[00]]`, `[0,-0]`, `[[0.5]]`, `[[0e1]]`,
	"[[1]," + strings.Repeat("[0],", 30) + "[0]]", "[[1]," + strings.Repeat("[ 0],", 30) + "[0]]", "[[1]," + strings.Repeat("[0],", 30) + "[01]]",
	"[[1]," + strings.Repeat("[0], ", 30) + "[0] ]", "[[1]," + strings.Repeat("[0] ,\n[\t0\r],", 30) + "[0]]", "[[1]," + strings.Repeat("[0],", 30) + "[ ]]",
	"[" + strings.Repeat("0, ", 40) + "0]", "[" + strings.Repeat("0,", 40) + "00]", "[" + strings.Repeat("1,0,", 40) + "01,2]", "[[1]," + strings.Repeat("[0,10],", 30) + "[0,]]",
	// token ids and batches spaced as Python's json.dumps writes them
	// (spacedIDRun), long enough to leave idRun, with what ends a run in
	// the middle of them (spaced, spacedBatches)
	spaced("5"), spaced("5, "), spaced("05"), spaced("5 "), spaced("5,  6"), spaced("12345678, 9"), spaced("5, -6"),
	spaced("1.5"), spaced("5 , 6"), spaced("5, [6]"), spaced("5]"), spaced("5, ]") + "]", spaced("5,\n6"),
	spacedBatches("5"), spacedBatches("5], []"), spacedBatches("5, ], [6"), spacedBatches("5]], [6"), spacedBatches("5], [ 6"),
	"[[[0, ]],[],[]]", "[[[0, ]],[],[1]]", "[[0, 5, ]]" + strings.Repeat(" ", 12), "[[0, ],[1,2,3,4,5,6,7]]",
	// short strings with an escape and 3-byte characters or a \u escape
	// (shortEscaped), valid and not: overlong, surrogate, cut, and \u
	// surrogates (the general way)
	longArray("\"\\\"\xe6\x97\xa5\"", "\"\\\"\xc3\xa9\xe6\x97\xa5\""), longArray("\"\\\"\xe0\x80\x80\"", "\"\\\"\xc3\xa9\xe6\x97\xa5\""),
	longArray("\"\\\"\xed\xa0\x80\"", "\"\\\"\xc3\xa9\xe6\x97\xa5\""), longArray("\"\\\"\xe6\x97\"", "\"\\\"\xc3\xa9\xe6\x97\xa5\""),
	longArray("\"\\\"\xef\xbf\xbf\xe0\xa0\x80\"", "\"\\\"\xc3\xa9\xe6\x97\xa5\""), longArray("\"\\\"\xe6\x97\xa5\x80\"", "\"\\\"\xc3\xa9\xe6\x97\xa5\""),
	longArray(`"\u00e9\u65e5"`, `"\\\u00e9\n"`), longArray(`"\ud83d\ude00"`, `"\\\u00e9\n"`), longArray(`"\ud83d"`, `"\\\u00e9\n"`),
	longArray(`"\u00g9"`, `"\\\u00e9\n"`), longArray(`"\u00e"`, `"\\\u00e9\n"`), longArray(`"\u0000\u001f"`, `"\\\u00e9\n"`),
	"[\"p\",\t" + strings.Repeat(`"\\\u00e9\n",`+"\t", 30) + `"x"]`, "[\"p\",\n" + strings.Repeat(`"ab",`+"\r\n ", 30) + `"x"]`,
	// strings spaced as json.dumps writes them (stringArray), with what
	// ends such a run among them
	"[\"p\", " + strings.Repeat(`"ab", "\n", "é", `, 12) + `"x"]`, "[\"p\", " + strings.Repeat(`"ab", "\n", `, 12) + `"x", ]`,
	"[\"p\", " + strings.Repeat(`"ab", "\n", `, 12) + `"x",  "y", "z" , 7, "\x"]`, "[\"p\", " + strings.Repeat(`"ab", `, 12) + "\"\x01\", \"y\"]",
	spacedBatches("5] , [6"), spacedBatches("5],[6"), spacedBatches("5], [00"), spacedBatches("5], 6, [7"), spacedBatches("5, 12345678"),
	// arrays of short strings other than ASCII (stringArray reads them
	// by a word test and utf8.Valid), long enough for the table, with a
	// string that is not UTF-8 (cut, overlong, a surrogate, a stray
	// continuation byte) or not closed within the word among them
	longArray("\"\xe6\x97\xa5\xe6\x9c\xac\"", "\"\xc3\xa9\""), longArray("\"\xc3\"", "\"\xc3\xa9\""),
	longArray("\"\xc0\x80\"", "\"\xc3\xa9\""), longArray("\"\xed\xa0\x80\"", "\"\xc3\xa9\""),
	longArray("\"a\x80\"", "\"\xc3\xa9\""), longArray("\"\xf0\x9f\x98\x80\xc3\xa9\xc3\xa9\"", "\"\xc3\xa9\""),
	longArray("\"\xf0\x9f\x98\x80\xc3\xa9\xc3\xa9a\"", "\"\xc3\xa9\""), longArray("\"\xc3\xa9\n\"", "\"\xc3\xa9\""),
	longArray("\"\xc3\xa9\\\\n\"", "\"\xc3\xa9\""), longArray("\"\xf4\x90\x80\x80\"", "\"\xc3\xa9\""),
	longArray("\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\"", "\"\xc3\xa9\""), longArray("\"\xe6\x97\xa5\xe6\x97\"", "\"\xc3\xa9\""),
	// short strings of characters other than ASCII and a simple escape
	// before the closing quote (stringArray's word test), long enough for
	// the table: valid, and with text before the escape that is not UTF-8
	// (cut, overlong, a stray continuation byte, a surrogate), an escape
	// that is not simple, or the escape elsewhere in the string
	longArray("\"\xc3\xa9\\n\",\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\\\"\",\"\xe6\x97\xa5\\\\\"", "\"\xc3\xa9\xc3\xa9\\t\""),
	longArray("\"\xc3\\t\"", "\"\xc3\xa9\xc3\xa9\\t\""), longArray("\"\xc0\x80\\n\"", "\"\xc3\xa9\xc3\xa9\\t\""),
	longArray("\"\xc3\xa9\xa9\\t\"", "\"\xc3\xa9\xc3\xa9\\t\""), longArray("\"\xed\xa0\x80\\t\"", "\"\xc3\xa9\xc3\xa9\\t\""),
	longArray("\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\\t\"", "\"\xc3\xa9\xc3\xa9\\t\""), longArray("\"\xc3\xa9\\x\"", "\"\xc3\xa9\xc3\xa9\\t\""),
	longArray("\"\xc3\xa9\\u00e9\"", "\"\xc3\xa9\xc3\xa9\\t\""), longArray("\"\xc3\xa9\\n\xc3\xa9\"", "\"\xc3\xa9\xc3\xa9\\t\""),
	longArray("\"\xc3\xa9\\n\xc3\"", "\"\xc3\xa9\xc3\xa9\\t\""), longArray("\"\xc3\xa9\\\"", "\"\xc3\xa9\xc3\xa9\\t\""),
	// and with the escape among 2-byte characters (shortEscaped), valid
	// or not (overlong, a stray continuation byte, a cut character)
	longArray("\"\xc3\xa9\\n\xc3\xa9\\t\xd0\xb4\"", "\"\xc3\xa9\\n\xc3\xa9\""),
	longArray("\"\\n\xc1\xbf\"", "\"\xc3\xa9\\n\xc3\xa9\""),
	longArray("\"\\n\xc0\xaf\"", "\"\xc3\xa9\\n\xc3\xa9\""),
	longArray("\"\\n\xa9\xc3\xa9\"", "\"\xc3\xa9\\n\xc3\xa9\""),
	longArray("\"\\n\xc3a\"", "\"\xc3\xa9\\n\xc3\xa9\""),
	longArray("\"\\n\xe6\x97\xa5\"", "\"\xc3\xa9\\n\xc3\xa9\""),
	longArray("\"\\n\xc3\xa9\xe6\x97\"", "\"\xc3\xa9\\n\xc3\xa9\""),
	longArray("\"\\n\xdf\xbf\xc2\x80\\u00e9\"", "\"\xc3\xa9\\n\xc3\xa9\""),
	longArray("\"\\n\xc3\\n\"", "\"\xc3\xa9\\n\xc3\xa9\""),
	longArray("\"\\n\xc3\xc3\xa9\"", "\"\xc3\xa9\\n\xc3\xa9\""), longArray("\"\\n\xdf\xff\"", "\"\xc3\xa9\\n\xc3\xa9\""),
	// a lone character of 2 or 3 bytes before an ASCII byte in a string
	// the table does not read (scanString's word test), valid or not
	"\"\xe6\x97\xa5\\u00e9 abcdefgh\"", "\"\xc3\xa9\\n\xc3\xa9\\u0041abcdefgh\"", "{\"\xe6\x97\xa5\\u00e9 \": \"\", \"\xe6\x97\xa5\\u00e9 \": \"\"}",
	"\"\xc0\xaf\\u0041abcdefgh\"", "\"\xc1\xbf\\u0041abcdefgh\"", "\"\xe0\x80\x80\\u0041abcdefgh\"", "\"\xe0\x9f\xbf\\u0041abcdefgh\"",
	"\"\xed\xa0\x80\\u0041abcdefgh\"", "\"\xe6\x97\\u0041abcdefgh\"", "\"\xe6\x97\xa5\xa5\\u0041abcdefgh\"", "\"\xc3\xa9\xa9\\u0041abcdefgh\"",
	"\"\xf0\x9f\x98\x80\\u0041abcdefgh\"", "\"\xe0\xa0\x80\\u0041abcdefgh\"", "\"\xed\x9f\xbf\\u0041abcdefgh\"", "\"\xc2\x80\\u0041abcdefgh\"",
	// literals (compared as a word), and \u escapes (four hex digits at once)
	`[true,false,null]`, `{"a":true,"b":false,"c":null}`, `[tru]`, `[trux]`, `[fals]`, `[falsx]`, `[falsE]`, `[nul]`, `[nulL]`,
	`[Null]`, `[t]`, `[f`, `[n`, `fals`, `nulll`, `[truefalse]`, `[null,]`,
	`"\u00E9\uABcd"`, `"\u0"`, `"\u00e"`, `"\uzzzz"`, `"\u00g0"`, `"\u00e9`, `"\u`,
	// short keys and values the validator's state table reads itself
	// (escapes, 2- and 3-byte characters) and those it hands to
	// scanString (\u, \b, restricted leads, 4-byte characters, bytes
	// that are not UTF-8), as keys, values in objects and elements
	`{"a\nb":"c\"d","e\/":["\\","\t\r\f"]}`, `["\b","\u0041","\x","\`,
	"{\"\xc3\xa9\":\"\xe4\xb8\xad\",\"k\":[\"\xdf\xbf\xef\xbf\xbf\"]}", "[\"\xe0\xa0\x80\",\"\xe0\x80\x80\",\"\xed\x9f\xbf\"]",
	"{\"a\":\"\xf0\x9f\x98\x80\",\"b\":\"\xf4\x90\x80\x80\"}", "[\"\xc3\",\"\xc3a\",\"\xe4\xb8\",\"\xe4\xb8a\"]",
	"[\"\xbf\",\"\xc0\x80\",\"\xc1\xbf\",\"\xff\"]", "{\"\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97\":1}", "[\"a\n\xc3\xa9\u00e9\"]",
	// runs of escapes (scanString reads four per word), broken at each
	// place of a word by a bad escape, a \u escape or a plain byte
	"\"" + strings.Repeat(`\n\t\\\/\"\b\f\r`, 9) + "\"", "\"" + strings.Repeat(`\\`, 40) + "\"", "\"" + strings.Repeat(`\\`, 40) + "\\\"",
	"\"" + strings.Repeat(`\n`, 20) + `\x` + strings.Repeat(`\n`, 20) + "\"", "\"" + strings.Repeat(`\n`, 21) + `\x` + strings.Repeat(`\n`, 20) + "\"",
	"\"" + strings.Repeat(`\n`, 22) + `\u00e9` + strings.Repeat(`\n`, 20) + "\"", "\"" + strings.Repeat(`\n`, 23) + `a` + strings.Repeat(`\n`, 20) + "\"",
	"\"" + strings.Repeat(`\n`, 20) + "\n" + strings.Repeat(`\n`, 20) + "\"", "\"" + strings.Repeat(`\n`, 20) + `\` + "\"",
	// objects in arrays, which the table reads without a stack entry:
	// empty, with every kind of value, with containers in them (which
	// do get one), nested in arrays, and each way of ending them wrongly
	`[{}]`, `[{ }]`, `[ { "a" : 1 } , { } ]`, `[{"a":"b","c":-1.5e3,"d":true,"e":null,"f":[],"g":{},"h":{ },"i":[ ]}]`,
	`[{"a":{"b":[{"c":{}}]}},{"d":[1,{"e":[]}]}]`, `[[{"a":1}],[{}]]`, `{"m":[{"r":"u","c":[{"t":"x"},{"u":{"v":"w"}}]}]}`,
	`[{"a":"` + strings.Repeat("x", 80) + `","b":"\u00e9\n","\u0041":["s"]}]`, "[{\"\xe4\xb8\xad\":\"\xf0\x9f\x98\x80\"}]",
	`[{"a":[1,2,3],"b":["x","y"]},{"c":[[1],[2]]}]`,
	`[{]`, `[{"a"}]`, `[{"a":}]`, `[{"a":1,}]`, `[{"a":1]`, `[{"a":1}`, `[{"a":1}}`, `[{"a" 1}]`, `[{a:1}]`, `[{"a":1,"b"}]`,
	`[{"a":{]}]`, `[{"a":[}]`, `[{"a":{}]`, `[{"a":1]}`, `[{,}]`, `[{"a":tru}]`, `[{"a":01}]`, `[{"a":"\x"}]`, "[{\"a\":\"\xff\"}]",
	// arrays of strings: in a member of the top-level object (stringArray)
	// and deeper (the stack and the table), empty, short and long, brackets
	// mismatched at each depth
	toolSchema, `{"tools": [` + toolSchema + `, ` + toolSchema + `]}`, `{"a": ["x", "y"], "b": {"c": ["x"], "d": [[], ["y", []]]}}`,
	`{"a": {"b": ["x", "y"}}`, `{"a": {"b": ["x", "y"]]}`, `{"a": {"b": ["x", "y",]}}`, `{"a": {"b": ["x" "y"]}}`, `{"a": {"b": [,"x"]}}`,
	`[{"a": {"b": ["x"}}]`, `[{"a": ["x"]]]`, `[{"a": ["x"}]`, `{"a": [["x"}]}`, `{"a": [{"b": ["x", "y"]}, ["z"]]}`,
	`{"a": {"b": [` + strings.Repeat(`"abcdefgh", `, 10) + `"x"]}}`, `{"a": {"b": [` + strings.Repeat(`"abcdefgh", `, 10) + `"x"}}`,
}, append(escapeRuns(), shortUEscapes()...)...)

// toolSchema is a tool definition as json.dumps writes it: objects nested
// five deep in an element of an array, and short arrays of strings in them.
const toolSchema = `{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a given city.", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}`

// escapeRuns are strings in which escapes follow one another with text
// between them (scanString reads what follows an escape a word at a time):
// runs of \u escapes as json.dumps writes text other than ASCII, and lines
// ending in \n, each broken at every byte of a word by a bad \u escape (a
// bad hex digit in each place, too few digits), another escape, a control
// character, a byte that is not UTF-8 or is, text of each length up to 40
// bytes, or the closing quote; each string at the end of the document or
// with a long string after it, and cut at the end of the buffer.
func escapeRuns() []string {
	runs := []string{strings.Repeat(`\u4f60\u597d\uff0c\u8bf7\u95ee `, 3), strings.Repeat(`Sure, here is the answer.\n`, 3), strings.Repeat(`\ud83d\ude00`, 6)}
	breaks := []string{`\u12g4`, `\ug234`, `\u1g34`, `\u123g`, `\u123`, `\u12"`, `\u"`, `\x`, `\"`, `\\u0041`, `\\`, `\/\b\f\r\t`,
		"\x01", "\\n\x01", "\\u00e9\x1f", "\xff", "\\n\xff", "\\u00e9\xc3", "\xc3\xa9", "\\u00e9\xe6\x97\xa5", "\xed\xa0\x80", "\xf0\x9f\x98\x80",
		`"`, `\n"`, `\u0041"`, `\ud83d"`, `"x`}
	for n := 1; n <= 40; n++ {
		breaks = append(breaks, strings.Repeat("x", n))
	}
	var cases []string
	for _, run := range runs {
		for _, br := range breaks {
			for k := 0; k < 8; k++ {
				s := `"` + strings.Repeat("a", k) + run + br + run + `"`
				cases = append(cases, s, `[`+s+`,"`+strings.Repeat("y", 30)+`"]`)
			}
		}
		// Cut at the end of the buffer, after the run and a \u escape
		// with fewer than four digits, or a backslash.
		for _, end := range []string{``, `\`, `\u`, `\u4`, `\u4f`, `\u4f6`, `\u4f60`, `\n`, `\u4f60"`} {
			cases = append(cases, `"`+run+end, `["`+run+end)
		}
	}
	return cases
}

// shortUEscapes are short strings with a \u escape (the validator's table
// reads one while the string fits it: see afterU) after each number of
// bytes up to the table's length and past it, valid and not (a bad hex
// digit in each place, too few digits; and escapes the table leaves for
// scanString at, which reads on from their backslash), after an escaped
// quote or not, followed by text (also text that takes the string past
// the table's length, or into the span table's) or another escape, as
// every kind of key and value the table's states tell apart, and cut at
// the end of the document.
func shortUEscapes() []string {
	var cases []string
	for p := 0; p <= maxStringBytes; p++ {
		for _, esc := range []string{`\u0062`, `\uD83D`, `\ug062`, `\u0g62`, `\u00g2`, `\u006g`, `\u006`, `\u`, `\u006"`, `\b`, `\x`, `\b\u0062`} {
			for _, after := range []string{``, `b`, `\n`, `\u0041`, "\x01", "\xc3\xa9", "\xff", strings.Repeat("b", 20), strings.Repeat("b", 70) + `\n`} {
				str := `"` + strings.Repeat("a", p) + esc + after + `"`
				if p >= 2 {
					str = `"\"` + str[3:] // an escaped quote first
				}
				cases = append(cases, str, `{`+str+`:1}`, `{"k":`+str+`}`, `[`+str+`]`, `[{`+str+`:1}]`, `[{"k":`+str+`}]`,
					`{"k":{`+str+`:[`+str+`]},`+str+`:2}`)
			}
			cases = append(cases, `{"`+strings.Repeat("a", p)+esc, `[{"k":"`+strings.Repeat("a", p)+esc)
		}
	}
	return cases
}

// longArray is a string array long enough for the validator's table (see
// jsonSpans) whose first elements after "p" are first (one or more
// strings, comma-separated) followed by 30 copies of fill.
// spaced returns an array of token ids spaced as json.dumps writes them,
// with mid among them; spacedBatches a batch of such arrays with mid in
// one of them.
func spaced(mid string) string {
	return "[" + strings.Repeat("1, 22, ", 20) + mid + ", " + strings.Repeat("333, 4444444, ", 20) + "7]"
}

func spacedBatches(mid string) string {
	return "[[" + strings.Repeat("1, 22], [", 20) + mid + "], [" + strings.Repeat("333, 4444444], [", 20) + "7]]"
}

func longArray(first, fill string) string {
	return `["p",` + first + "," + strings.Repeat(fill+",", 30) + `"x"]`
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
	spans := jsonSpans{checkUTF8: true}
	f.Fuzz(func(t *testing.T, b []byte) {
		valid := json.Valid(b)
		if got := validJSON(b); got != valid {
			t.Fatalf("validJSON(%q) = %v, encoding/json says %v", b, got, valid)
		}
		// The parser's pass also checks UTF-8: it accepts exactly the
		// documents both encoding/json and utf8.Valid accept, and blames
		// UTF-8 only for a body that is not UTF-8.
		isUTF8 := utf8.Valid(b)
		if got := scanJSON(b, &spans); got != (valid && isUTF8) || spans.badUTF8 && isUTF8 {
			t.Fatalf("scanJSON(%q) with UTF-8 = %v (badUTF8 %v), encoding/json %v, utf8.Valid %v", b, got, spans.badUTF8, valid, isUTF8)
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
	f.Add([]byte(`{"messages":[{"role":"system","content":"` + strings.Repeat("long \\\"text\\\" ", 20) + `"},{"content":[` +
		`{"type":"text","text":"` + strings.Repeat("x", 100) + `"}]}],"prompt":[` + strings.Repeat("1,", 60) + `2]}`))
	// Text as json.dumps escapes it: runs of \u escapes of CJK, surrogate
	// pairs and halves, lines ending in \n.
	f.Add([]byte(`{"messages": [{"role": "user", "content": "` + strings.Repeat(`\u4f60\u597d\uff0c\u8bf7\u95ee `, 4) +
		`\ud83d\ude00\u00e9\ud83d \ude00x"}, {"role": "assistant", "content": "` + strings.Repeat(`Sure, here is the answer.\n`, 3) + `"}]}`))
	var spans jsonSpans
	f.Fuzz(func(t *testing.T, b []byte) {
		valid := validJSON(b)
		if got := scanJSON(b, &spans); got != valid {
			t.Fatalf("scanJSON(%q) = %v, validJSON %v", b, got, valid)
		}
		if !valid {
			return
		}
		i := SkipSpace(b, 0)
		v := b[i:(*jsonDoc)(nil).skip(b, i)] // the walker's skip by scanning alone
		compare(t, nil, v, gjson.ParseBytes(v))
		// The same walk through the span table of the validating pass.
		doc := &jsonDoc{jsonSpans: spans, base: cap(b)}
		compare(t, doc, b[i:doc.skip(b, i)], gjson.ParseBytes(v))
	})
}

// compare walks raw with d (nil: by scanning alone) and checks every span
// and string text against gjson's.
func compare(t *testing.T, d *jsonDoc, raw []byte, g gjson.Result) {
	t.Helper()
	if string(raw) != g.Raw {
		t.Fatalf("span %q, gjson raw %q", raw, g.Raw)
	}
	switch {
	case g.Type == gjson.String:
		got := stringOf(raw) // text needs a doc
		if d != nil {
			got = d.text(raw)
		}
		if got != g.Str {
			t.Fatalf("stringOf(%q) = %q, gjson %q", raw, got, g.Str)
		}
	case g.IsObject():
		var keys, vals [][]byte
		d.members(raw, func(k, v []byte) bool { keys, vals = append(keys, k), append(vals, v); return true })
		n := 0
		g.ForEach(func(k, v gjson.Result) bool {
			if n >= len(keys) || string(keys[n]) != k.Raw {
				t.Fatalf("member %d: walker %q, gjson %q", n, keys, k.Raw)
			}
			compare(t, d, vals[n], v)
			n++
			return true
		})
		if n != len(keys) {
			t.Fatalf("walker found %d members, gjson %d", len(keys), n)
		}
	case g.IsArray():
		var vals [][]byte
		d.elements(raw, func(v []byte) bool { vals = append(vals, v); return true })
		n := 0
		g.ForEach(func(_, v gjson.Result) bool {
			if n >= len(vals) {
				t.Fatalf("walker found %d elements, gjson more", len(vals))
			}
			compare(t, d, vals[n], v)
			n++
			return true
		})
		if n != len(vals) {
			t.Fatalf("walker found %d elements, gjson %d", len(vals), n)
		}
	}
}

// needsLook must flag every word holding a quote, a backslash or a control
// character, wherever it sits, and no other word: a miss would let the
// validator accept a control character or run past a string's end.
func TestNeedsLookFlagsExactlyTheSpecialBytes(t *testing.T) {
	for c := 0; c < 256; c++ {
		for _, fill := range []byte{'a', ' ', '!', '#', 0x7f, 0x80, 0xc3, 0xff} {
			for pos := 0; pos < 8; pos++ {
				var w [8]byte
				for k := range w {
					w[k] = fill
				}
				w[pos] = byte(c)
				got := needsLook(binary.LittleEndian.Uint64(w[:])) != 0
				if want := !plainStringByte[c]; got != want {
					t.Fatalf("needsLook(byte %#x at %d among %#x) = %v, want %v", c, pos, fill, got, want)
				}
			}
		}
	}
}

// The span table records long strings (with their escapes) and containers,
// by start, so the walker can step over them.
func TestScanJSONRecordsSpans(t *testing.T) {
	long := strings.Repeat("y", minSpanString)
	b := []byte(`{"a":"` + long + `","b":["s\\n` + long + `",{}],"c":"short"}`)
	var spans jsonSpans
	if !scanJSON(b, &spans) {
		t.Fatal("valid document rejected")
	}
	var got []string
	for _, s := range spans.spans {
		got = append(got, fmt.Sprintf("%s/%v", b[s.start:s.end], s.escaped))
	}
	want := []string{string(b) + "/false", `"` + long + `"/false`, `["s\\n` + long + `",{}]/false`, `"s\\n` + long + `"/true`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("spans\n%q\nwant\n%q", got, want)
	}
	// An object in an array has no entry; the containers and long
	// strings in it do, and the array does.
	b = []byte(`[{"a":1},{"b":{"c":2},"d":"` + long + `"},{"e":[3,"x"]}]`)
	if !scanJSON(b, &spans) {
		t.Fatal("valid document rejected")
	}
	got = got[:0]
	for _, s := range spans.spans {
		got = append(got, string(b[s.start:s.end]))
	}
	if want := []string{string(b), `{"c":2}`, `"` + long + `"`, `[3,"x"]`}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("spans\n%q\nwant\n%q", got, want)
	}
	// A failed pass leaves nothing a walker could trust beyond the body.
	if scanJSON([]byte(`{"a":[`), &spans) {
		t.Fatal("truncated document accepted")
	}
}

// Arrays of strings below a member of the top-level object go the way of
// other containers (the stack and the span table): each has an entry, and
// only a prompt's strings are gathered as text. Every truncation of a body
// of tool schemas is refused.
func TestScanJSONNestedStringArrays(t *testing.T) {
	long := strings.Repeat(`"abcdefgh", `, 10) + `"x"`
	b := []byte(`{"prompt": [` + long + `], "tools": [{"p": {"enum": [` + long + `], "r": ["city"]}}]}`)
	spans := jsonSpans{checkUTF8: true}
	if !scanJSON(b, &spans) {
		t.Fatal("valid document rejected")
	}
	var got []string
	for _, s := range spans.spans {
		got = append(got, string(b[s.start:s.end]))
	}
	want := []string{string(b), "[" + long + "]", `[{"p": {"enum": [` + long + `], "r": ["city"]}}]`, `{"enum": [` + long + `], "r": ["city"]}`, "[" + long + "]", `["city"]`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("spans\n%q\nwant\n%q", got, want)
	}
	if len(spans.textRuns) != 1 || spans.textRuns[0].start != int32(strings.Index(string(b), "[")) {
		t.Errorf("text runs %v, want the prompt's alone", spans.textRuns)
	}
	body := `{"model": "m", "tools": [` + toolSchema + `, ` + toolSchema + `]}`
	for n := range len(body) {
		if scanJSON([]byte(body[:n]), &spans) {
			t.Fatalf("truncated at %d accepted: %q", n, body[:n])
		}
	}
	if !scanJSON([]byte(body), &spans) {
		t.Fatal("tool schemas rejected")
	}
}

// plainRun must return exactly the first byte that needs a look, for every
// such byte at every offset within and across its 64- and 8-byte steps,
// with a look-alike byte (one above it in value, or a UTF-8 byte) before
// and after it; without one it may stop only within the last 8 bytes.
func TestPlainRunFindsTheFirstSpecialByte(t *testing.T) {
	stops := func(c byte, nonASCII bool) bool {
		return !plainStringByte[c] || nonASCII && c >= 0x80
	}
	fills := []byte{'a', ' ', '!', '#', ']', '^', 0x7f, 0x80, 0xc3, 0xff}
	for _, nonASCII := range []bool{false, true} {
		var mask uint64
		if nonASCII {
			mask = highBits
		}
		for _, n := range []int{0, 1, 7, 8, 9, 63, 64, 65, 130, 200, 260} {
			for _, fill := range fills {
				if stops(fill, nonASCII) {
					continue
				}
				b := bytes.Repeat([]byte{fill}, n)
				for from := 0; from <= n && from < 3; from++ {
					got := plainRun(b, from, mask)
					if got < from || got > n || got < n-7 {
						t.Fatalf("nonASCII=%v: plainRun(%d x %#x, %d) = %d, want within the last 7 bytes", nonASCII, n, fill, from, got)
					}
				}
				for c := 0; c < 256; c++ {
					if !stops(byte(c), nonASCII) {
						continue
					}
					for pos := 0; pos < n; pos++ {
						b := bytes.Repeat([]byte{fill}, n)
						b[pos] = byte(c)
						if pos+1 < n {
							b[pos+1] = byte(c) // a second hit after the first changes nothing
						}
						from := 0
						if pos > 0 {
							from = 1
						}
						got := plainRun(b, from, mask)
						if got != pos && !(got < pos && got >= n-7) {
							t.Fatalf("nonASCII=%v: byte %#x at %d of %d among %#x: plainRun = %d", nonASCII, c, pos, n, fill, got)
						}
						if got < pos && pos-got > 7 {
							t.Fatalf("nonASCII=%v: byte %#x at %d: stopped %d bytes early", nonASCII, c, pos, pos-got)
						}
					}
				}
			}
		}
	}
}

// shortString ends exactly the strings skipString ends, when they close
// within minSpanString bytes and hold no escape, and gives up (-1) on every
// other string; hasBackslash agrees with bytes.IndexByte.
func TestShortStringAndHasBackslash(t *testing.T) {
	fills := []byte{'a', ' ', 0x7f, 0xc3}
	specials := []byte{'"', '\\', 0x00, 0x1f, '\n'}
	for n := 0; n <= minSpanString+9; n++ {
		for _, fill := range fills {
			for _, sp := range specials {
				for pos := -1; pos < n; pos++ {
					inner := bytes.Repeat([]byte{fill}, n)
					if pos >= 0 {
						inner[pos] = sp
					}
					for _, tail := range []string{`"`, `"}`, `\"x"`, ``} {
						b := append(append([]byte{'"'}, inner...), tail...)
						got, full := shortString(b, 0), skipString(b, 0)
						plainEnd := bytes.IndexAny(b[1:], "\"\\\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f")
						short := plainEnd >= 0 && b[1+plainEnd] == '"' && plainEnd+2 <= minSpanString+1
						// shortString: skipString's end for a valid string
						// (escapes included) that ends within minSpanString
						// bytes after its quote, else -1. An invalid string
						// is outside its contract (it reads validated JSON).
						fits := full >= 0 && full <= minSpanString+1
						switch {
						case full < 0:
						case fits && got != full:
							t.Fatalf("shortString(%q) = %d, skipString %d", b, got, full)
						case !fits && got != -1:
							t.Fatalf("shortString(%q) = %d, want -1", b, got)
						}
						// shortPlain: the same end for a string of up to 8
						// ASCII bytes with room for its word test, else -1.
						ascii := true
						for k := 1; k <= plainEnd; k++ {
							ascii = ascii && b[k] < utf8.RuneSelf
						}
						quick := short && ascii && plainEnd <= 8 && len(b) >= 10
						if got := shortPlain(b, 0); quick && got != full || !quick && got != -1 {
							t.Fatalf("shortPlain(%q) = %d, skipString %d (want it found: %v)", b, got, full, quick)
						}
						if want := bytes.IndexByte(b, '\\') >= 0; hasBackslash(b) != want {
							t.Fatalf("hasBackslash(%q) = %v", b, !want)
						}
					}
				}
			}
		}
	}
}

// validRun agrees with utf8.Valid on runs of bytes above 0x7f: random runs
// built from valid and invalid characters of every length, with the lead
// bytes whose second byte is restricted (E0, ED, F0, F4) and the overlong
// C0 and C1, at every offset.
func TestValidRunMatchesUTF8Valid(t *testing.T) {
	pieces := []string{
		"é", "ж", "ß", "中", "文", "😀", "\u0800", "\uffff", "\ud7ff", "\ue000", "\U00010000", "\U0010ffff", "\u07ff", "\u0080",
		"\xe0\xa0\x80", "\xe0\x80\x80", "\xed\x9f\xbf", "\xed\xa0\x80", "\xc0\x80", "\xc1\xbf", "\xc2", "\xe4\xb8", "\xf4\x90\x80\x80",
		"\xf0\x80\x80\x80", "\x80", "\xbf", "\xff", "\xfe", "\xf8\x88\x80\x80\x80",
	}
	rng := rand.New(rand.NewSource(4))
	for trial := 0; trial < 20000; trial++ {
		var b []byte
		for n := rng.Intn(12); n >= 0; n-- {
			switch rng.Intn(3) {
			case 0:
				b = append(b, pieces[rng.Intn(len(pieces))]...)
			case 1:
				b = append(b, strings.Repeat(pieces[rng.Intn(len(pieces))], 1+rng.Intn(5))...)
			default:
				b = append(b, pieces[rng.Intn(4)]...) // runs of valid characters, so the fast steps get to run
			}
		}
		for off := 0; off < len(b) && off < 4; off++ {
			if got, want := validRun(b[off:]), utf8.Valid(b[off:]); got != want {
				t.Fatalf("validRun(%q) = %v, utf8.Valid %v", b[off:], got, want)
			}
		}
	}
}

// Strings mixing ASCII (escapes, quotes, control characters included) and
// multi-byte characters, valid and not, at every alignment: the UTF-8
// checking pass accepts exactly what encoding/json and utf8.Valid accept.
func TestScanJSONMixedScripts(t *testing.T) {
	pieces := []string{
		"a", " ", "kvroute ", "0123456789", `\"`, `\\`, `\n`, `\u00e9`, "\"", "\\", "\t", "\x01", "\x7f",
		"é", "ж", "中", "文字", "😀", "\xe0\xa0\x80", "\xe0\x80\x80", "\xed\xa0\x80", "\xc0\x80", "\xc2", "\xe4\xb8", "\x80", "\xff",
	}
	rng := rand.New(rand.NewSource(5))
	spans := jsonSpans{checkUTF8: true}
	for trial := 0; trial < 20000; trial++ {
		var sb strings.Builder
		sb.WriteString(`{"k":"`)
		for n := rng.Intn(40); n >= 0; n-- {
			p := pieces[rng.Intn(len(pieces))]
			if rng.Intn(4) > 0 {
				p = []string{"中文字符", "ab", "é", " x "}[rng.Intn(4)] // mostly valid text, so long runs happen
			}
			sb.WriteString(p)
		}
		sb.WriteString(`"}`)
		b := []byte(sb.String())
		valid, isUTF8 := json.Valid(b), utf8.Valid(b)
		if got := scanJSON(b, &spans); got != (valid && isUTF8) || spans.badUTF8 && isUTF8 {
			t.Fatalf("scanJSON(%q) = %v (badUTF8 %v), encoding/json %v, utf8.Valid %v", b, got, spans.badUTF8, valid, isUTF8)
		}
	}
}

// Escaped strings decode as gjson decodes them, through the doc's buffer
// (several strings of one body, each still intact after the next) and
// without one: every escape, surrogate pairs, lone and mismatched halves,
// escapes at the ends, runs of every length between them.
func TestUnescapeMatchesGJSON(t *testing.T) {
	pieces := []string{
		`\n`, `\"`, `\\`, `\/`, `\b`, `\f`, `\r`, `\t`, `\u0000`, `\u00e9`, `\u4E2D`, `\uffff`, `\ud83d\ude00`, `\uD83D\uDE00`,
		`\ud83d`, `\ude00`, `\ud83d\u0041`, `\ud83d\ud83d`, `\ude00\ud83d`, `\ud83dx`, "é", "中", "a", "abcdefgh", " ",
	}
	rng := rand.New(rand.NewSource(6))
	for trial := 0; trial < 5000; trial++ {
		var raws [][]byte
		var body []byte
		body = append(body, '[')
		for k := 0; k < 3; k++ {
			var sb strings.Builder
			sb.WriteByte('"')
			for n := rng.Intn(30); n >= 0; n-- {
				if rng.Intn(3) == 0 {
					sb.WriteString(strings.Repeat("x", rng.Intn(70)))
				}
				sb.WriteString(pieces[rng.Intn(len(pieces))])
			}
			sb.WriteByte('"')
			if k > 0 {
				body = append(body, ',')
			}
			body = append(body, sb.String()...)
			raws = append(raws, []byte(sb.String()))
		}
		body = append(body, ']')
		spans := jsonSpans{checkUTF8: true}
		if !scanJSON(body, &spans) {
			t.Fatalf("test body rejected: %s", body)
		}
		d := &jsonDoc{jsonSpans: spans, base: cap(body)}
		var got []string
		for pos := SkipSpace(body, 1); ; {
			v, next, ok := d.element(body, pos)
			if !ok {
				break
			}
			pos = next
			got = append(got, d.text(v))
		}
		for k, raw := range raws {
			want := gjson.ParseBytes(raw).Str
			if got[k] != want {
				t.Fatalf("doc text(%s) = %q, gjson %q", raw, got[k], want)
			}
			if s := stringOf(raw); s != want {
				t.Fatalf("stringOf(%s) = %q, gjson %q", raw, s, want)
			}
		}
	}
}

// digitsWord reads exactly the digits a word starts with, for every count
// of digits, every digit and every byte that may end them.
func TestDigitsWordMatchesALoop(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for trial := 0; trial < 200000; trial++ {
		var w [8]byte
		for k := range w {
			w[k] = byte(rng.Intn(256))
			if rng.Intn(3) > 0 {
				w[k] = '0' + byte(rng.Intn(10))
			}
		}
		w[0] = '1' + byte(rng.Intn(9))
		wantV, wantN := uint64(0), 0
		for wantN < 8 && w[wantN]-'0' <= 9 {
			wantV, wantN = wantV*10+uint64(w[wantN]-'0'), wantN+1
		}
		if wantN == 8 {
			wantV, wantN = 0, 0
		}
		if v, n := digitsWord(binary.LittleEndian.Uint64(w[:])); v != wantV || n != wantN {
			t.Fatalf("digitsWord(%q) = %d, %d; want %d, %d", w[:], v, n, wantV, wantN)
		}
	}
}

// shortUTF8 must accept no string of up to 8 bytes that utf8.Valid
// refuses, of the bytes its word tests judge (leads and continuation bytes
// of 2- and 3-byte characters, and bytes around them), whatever follows
// them; and it must accept the shapes it is for.
func TestShortUTF8MatchesUTF8Valid(t *testing.T) {
	bytes := []byte{'a', 0x80, 0x9f, 0xa0, 0xa9, 0xbf, 0xc0, 0xc1, 0xc2, 0xc3, 0xdf, 0xe0, 0xe6, 0xed, 0xef, 0xf0, 0xf4, 0xff}
	rng := rand.New(rand.NewSource(1))
	var w [8]byte
	for range 200000 {
		n := 1 + rng.Intn(8)
		for k := range w {
			w[k] = bytes[rng.Intn(len(bytes))]
		}
		if rng.Intn(2) == 0 { // mostly valid text: characters of 2 and 3 bytes
			s := []rune{'é', 'ж', '日', 'ࠀ', '\uffff', '\u0080', '\u07ff', '\ud7ff', '\ue000'}
			copy(w[:], string([]rune{s[rng.Intn(len(s))], s[rng.Intn(len(s))], s[rng.Intn(len(s))]}))
		}
		x := binary.LittleEndian.Uint64(w[:])
		if got, want := shortUTF8(x, n), utf8.Valid(w[:n]); got && !want {
			t.Fatalf("shortUTF8(% x) = %v, utf8.Valid %v", w[:n], got, want)
		}
	}
	for _, s := range []string{"é", "éж", "жжжж", "\u0080", "\u07ff\u07ff"} {
		w = [8]byte{}
		copy(w[:], s)
		if !shortUTF8(binary.LittleEndian.Uint64(w[:]), len(s)) {
			t.Errorf("shortUTF8(%q) = false", s)
		}
	}
}

// hex4Word agrees with isHex4 on every byte in each place of a word of hex
// digits, and on a spread of other words.
func TestHex4Word(t *testing.T) {
	check := func(w [4]byte) {
		if got, want := hex4Word(binary.LittleEndian.Uint32(w[:])), isHex4(w[:]); got != want {
			t.Fatalf("hex4Word(%q) = %v, isHex4 %v", w, got, want)
		}
	}
	for c := 0; c < 256; c++ {
		for p := range 4 {
			for _, f := range []byte{'0', '9', 'a', 'f', 'A', 'F'} {
				w := [4]byte{f, f, f, f}
				w[p] = byte(c)
				check(w)
			}
		}
	}
	for x := uint64(0); x < 1<<32; x += 7919 {
		check([4]byte{byte(x), byte(x >> 8), byte(x >> 16), byte(x >> 24)})
	}
}
