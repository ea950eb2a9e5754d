package openai

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
	"unicode/utf8"
)

// validJSON reports whether b is one JSON value (RFC 8259) with nothing but
// whitespace around it. It does not check UTF-8 (the caller runs
// utf8.Valid, which is fast everywhere).
//
// Why not gjson.Valid: it walks byte by byte through small functions, and Go
// code compiled to Wasm pays for every call (docs/performance.md). This
// validator is one loop with an explicit nesting stack, and strings (nearly
// all of a prompt) are skipped 64 to 128 bytes at a time (see plainRun), which
// is many times faster in Wasm.
func validJSON(b []byte) bool { return scanJSON(b, nil) }

// jsonSpans is what one validating pass learns for the passes after it:
// where each long string and each container ends, and whether a long string
// holds escapes. With it, the walker (jsonwalk.go) steps over a value in
// one lookup instead of rescanning its bytes: the router's parse visits the
// prompt nested three deep (the messages array, a message, its content),
// and without the table each level rescanned it.
type jsonSpans struct {
	spans []jsonSpan // by start, ascending: the order the pass meets them
	stack []int32    // the pass's open containers (indexes into spans)

	// checkUTF8 makes the pass also check that strings are UTF-8 (bytes
	// outside strings must be ASCII anyway), saving the caller a separate
	// utf8.Valid pass over the body; badUTF8 then reports a failure due to
	// a string that is not.
	checkUTF8, badUTF8 bool

	// The token ids the pass read: of each long array of plain integers
	// and each long array of such arrays (a token-id prompt and a batch of
	// them), in body order, and where each array's ids are (runs, by
	// start). The parser hashes a prompt's ids from here rather than
	// reading its digits a second time: reading them made a body of token
	// ids cost twice its validation.
	ids  []uint32
	runs []tokenRun
	// The same for the texts of long arrays of strings (a prompt sent as
	// strings): each array's strings, unescaped and concatenated, are
	// textBuf[from:to] of its entry in textRuns.
	textBuf  []byte
	textRuns []tokenRun
}

// tokenRun is the token ids of the array body[start:...]: ids[from:to].
// An array holding a number that is no token id (above maxTokenID) has
// none.
type tokenRun struct{ start, from, to int32 }

// jsonSpan is one value of the validated body: body[start:end].
type jsonSpan struct {
	start, end int32
	escaped    bool // a string with at least one escape
}

// minSpanString is the shortest string worth a table entry: shorter ones
// are skipped by scanning about as fast as by a lookup.
const minSpanString = 64

// scanJSON is validJSON that also fills rec (when not nil) for b.
func scanJSON(b []byte, rec *jsonSpans) bool {
	if rec == nil {
		ok, _ := scanJSONWith(b, nil, nil)
		return ok
	}
	return rec.scan(b)
}

// scan is scanJSON into s. Small enough to be inlined, so that a request
// enters no function for it.
func (s *jsonSpans) scan(b []byte) bool {
	ok, stack := scanJSONWith(b, s, s.stack[:0])
	s.stack = stack[:0] // kept for the next body (no defer: in Wasm a call to the runtime and back)
	return ok
}

// scanJSONWith is scanJSON with the container stack passed in, and returned
// (grown) for reuse.
func scanJSONWith(b []byte, rec *jsonSpans, stack []int32) (bool, []int32) {
	// stack holds the positions of open containers' brackets, or their
	// rec.spans indexes.
	var nonASCII uint64 // plainRun's extra stop mask: the high bits when checking UTF-8
	if rec != nil {
		rec.badUTF8 = false
		if rec.checkUTF8 {
			nonASCII = 0x8080808080808080
		}
		rec.spans = rec.spans[:0]
		rec.ids, rec.runs = rec.ids[:0], rec.runs[:0]
		rec.textBuf, rec.textRuns = rec.textBuf[:0], rec.textRuns[:0]
		if len(b) >= math.MaxInt32 {
			rec = nil // offsets would not fit: validate without the table
		}
	}
	// opener returns the bracket of the container stack entry e stands for.
	opener := func(e int32) byte {
		if rec != nil {
			return b[rec.spans[e].start]
		}
		return b[e]
	}
	var top byte // the bracket of the innermost open container, 0 outside all
	i := SkipSpace(b, 0)
scan:
	for key := false; ; {
		// A value starts at b[i], or with key set an object's key (after
		// '{' or a comma in an object): a string, read by the value's
		// string code (one copy of it), then ':'.
		if i >= len(b) || key && b[i] != '"' {
			break scan
		}
		if rec != nil && len(rec.spans) == cap(rec.spans) {
			rec.grow() // room for the span this value may add
		}
		switch c := b[i]; {
		case c == '{' || c == '[':
			open := i
			// An array of plain integers (a token-id prompt, or one of
			// its batches) in one call, without a stack entry; in the
			// table only when long, as strings are.
			if c == '[' && i+1 < len(b) && (b[i+1]-'1' <= 8 || b[i+1] == '[') { // a chat body never enters it
				if e := intArrays(b, i, rec); e > 0 {
					i = e
					break
				}
			}
			if c == '[' && i+1 < len(b) && b[i+1] == '"' && rec != nil {
				if e := stringArray(b, i, rec, nonASCII); e > 0 {
					i = e
					break
				}
			}
			i = SkipSpace(b, i+1)
			if i < len(b) && b[i] == c+2 { // '{'+2 == '}', '['+2 == ']'
				i++
				break
			}
			e := int32(open) // the stack entry
			if rec != nil {
				e = rec.add(jsonSpan{start: int32(open), end: -1})
			}
			stack = append(stack, e)
			top = c
			key = c == '{'
			continue
		case c == '"':
			if e := shortPlain(b, i); e >= 0 {
				i = e // too short for the table
			} else {
				start := i
				var escaped bool
				if i, escaped = scanString(b, i, nonASCII); i < 0 {
					break scan
				}
				// Long values in the table; keys never (the walker scans them).
				if rec != nil && !key && i-start >= minSpanString {
					rec.add(jsonSpan{start: int32(start), end: int32(i), escaped: escaped})
				}
			}
			if key {
				if i = SkipSpace(b, i); i >= len(b) || b[i] != ':' {
					break scan
				}
				i = SkipSpace(b, i+1)
				key = false
				continue
			}
		case c >= '1' && c <= '9':
			// A plain integer (token ids, max_tokens) ends here without
			// a call; a fraction or an exponent goes to skipNumber.
			j := i + 1
			for j < len(b) && b[j] >= '0' && b[j] <= '9' {
				j++
			}
			if j < len(b) && (b[j] == '.' || b[j]|0x20 == 'e') {
				if j = skipNumber(b, i); j < 0 {
					break scan
				}
			} else if top == '[' && j+1 < len(b) && b[j] == ',' {
				j = integerRun(b, j)
			}
			i = j
		case c == '-' || c == '0':
			if i = skipNumber(b, i); i < 0 {
				break scan
			}
		case c == 't' || c == 'f' || c == 'n':
			// true, false or null: one comparison of four bytes as a
			// word (and false's 'e'), where a comparison of strings in
			// Wasm is a call to the runtime and ~100 instructions here.
			if len(b)-i < 4 {
				break scan
			}
			switch w := binary.LittleEndian.Uint32(b[i:]); {
			case w == wordTrue || w == wordNull:
				i += 4
			case w == wordFals && len(b)-i > 4 && b[i+4] == 'e':
				i += 5
			default:
				break scan
			}
		default:
			break scan
		}
		// After a value: close containers, or a comma and the next element.
		for {
			i = SkipSpace(b, i)
			if len(stack) == 0 {
				return i == len(b), stack
			}
			if i >= len(b) {
				break scan
			}
			switch {
			case b[i] == ',':
				i = SkipSpace(b, i+1)
				key = top == '{'
			case b[i] == top+2: // the matching bracket
				if rec != nil {
					rec.spans[stack[len(stack)-1]].end = int32(i + 1)
				}
				stack = stack[:len(stack)-1]
				if top = 0; len(stack) > 0 {
					top = opener(stack[len(stack)-1])
				}
				i++
				continue
			default:
				break scan
			}
			break
		}
	}
	// Every failure breaks out to here: one return, and one test for a
	// string that is not UTF-8 (in Wasm each copy is code of a function
	// every request enters). Only scanString ends at badUTF8.
	if i == badUTF8 {
		rec.badUTF8 = true
	}
	return false, stack
}

// add appends sp to the table, which has room for it (see grow), and
// returns its index. Not an append: in Go's Wasm port an append is ~170
// instructions (the call that grows the array, the write barrier that
// stores it), and scanJSONWith, which every request enters, had two.
func (s *jsonSpans) add(sp jsonSpan) int32 {
	n := len(s.spans)
	s.spans = s.spans[:n+1]
	s.spans[n] = sp
	return int32(n)
}

// grow makes room in the table for one more span. scanJSONWith calls it,
// before each value that may add one, only when the table is full: its
// array is kept for the next body, so after the first few bodies never.
// Not inlined: see add.
//
//go:noinline
func (s *jsonSpans) grow() { s.spans = slices.Grow(s.spans, 1) }

// intArrays returns the index after the array starting at b[i] when it
// holds nothing but plain integers (no zero, sign, fraction or exponent),
// or nothing but non-empty arrays of them, separated by commas without
// spaces, as token-id prompts and their batches are sent; and -1 for any
// other array, which the caller then scans its general way (having lost
// at most this scan of it). A 1 MiB prompt of [7,8] batches spent most of
// its validation opening and closing each batch as a container. A long
// array goes in rec's table, and its integers, when all are token ids, in
// rec.ids (see tokenRun). Not inlined: inlined into scanJSONWith it made
// parsing a body of many unused keys, which holds no array, 1.7 times
// slower in Wasm (measured with the parser's benchmarks compiled to wasip1
// on wazero), though the validation itself was no slower.
//
//go:noinline
func intArrays(b []byte, i int, rec *jsonSpans) int {
	start, nested := i, i+1 < len(b) && b[i+1] == '['
	// ids[:n] are the ids read, written by index into the buffer's full
	// length, grown first to hold every integer the rest of b can (an
	// append per id, or growing the buffer as it fills, made reading them
	// cost more than validating them in Wasm). The buffer is kept for the
	// next body: at most twice the largest body's bytes, as the span table
	// can be.
	var ids []uint32
	n := 0
	if rec != nil {
		n = len(rec.ids)
		if most := n + (len(b)-i)/2 + 1; cap(rec.ids) < most {
			rec.ids = slices.Grow(rec.ids, most-n)
		}
		ids = rec.ids[:cap(rec.ids)]
	}
	from, tokens := n, true
	if nested {
		i++
	}
arrays:
	for {
		// An array of integers from b[i] ('['): a digit 1-9 starts each,
		// and a comma or the closing bracket follows it. An empty batch
		// is valid JSON but no token ids.
		closed := nested && i+1 < len(b) && b[i+1] == ']'
		if closed {
			tokens = false
		}
		for i++; !closed && i < len(b) && b[i]-'1' <= 8; i++ {
			v, digits := uint64(b[i]-'0'), 1
			for i++; i < len(b) && b[i]-'0' <= 9; i++ {
				v, digits = v*10+uint64(b[i]-'0'), digits+1
			}
			if digits > 10 || v > maxTokenID {
				tokens = false
			}
			if n < len(ids) {
				ids[n] = uint32(v)
				n++
			}
			if i < len(b) && b[i] == ']' {
				closed = true
				break
			}
			if i >= len(b) || b[i] != ',' {
				break
			}
		}
		if !closed {
			i = -1 // not such an array
			break arrays
		}
		i++
		if !nested {
			break
		}
		// The next batch, or the end of the outer array.
		if i+1 < len(b) && b[i] == ',' && b[i+1] == '[' {
			i++
			continue
		}
		if i >= len(b) || b[i] != ']' {
			i = -1
			break arrays
		}
		i++
		break
	}
	if rec == nil {
		return i
	}
	// The ids stay only for a long array of token ids; the buffer, grown
	// or not, stays for the next.
	keep := from
	if i-start >= minSpanString {
		rec.add(jsonSpan{start: int32(start), end: int32(i)})
		if tokens {
			keep = n
			rec.runs = append(rec.runs, tokenRun{int32(start), int32(from), int32(n)})
		}
	}
	rec.ids = rec.ids[:keep] // ids is rec.ids's array
	return i
}

// stringArray is intArrays for an array of strings separated by commas
// without spaces (a prompt sent as strings), with the table rec: it returns
// the index after the array starting at b[i], or -1 for any other array or
// a string it must refuse (the caller's general way then finds why). A long
// array goes in the table, and the text of its strings, unescaped and
// concatenated, in rec.textBuf (see texts): the parser hashes the prompt from
// there rather than finding and copying each string a second time.
// nonASCII is as for scanString. Not inlined, as intArrays.
//
//go:noinline
func stringArray(b []byte, i int, rec *jsonSpans, nonASCII uint64) int {
	start, from := i, len(rec.textBuf)
	// text[:n] is the text so far, written into the buffer's full length,
	// which is grown first to hold every string of the rest of b (no text
	// is longer than its string) and 8 bytes more: a short string is
	// copied as one 8-byte word (a call to copy per string cost more than
	// finding it). The buffer is kept: at most the largest body.
	n := from
	if most := n + len(b) - i + 8; cap(rec.textBuf) < most {
		rec.textBuf = slices.Grow(rec.textBuf, most-n)
	}
	text := rec.textBuf[:cap(rec.textBuf)]
	end := -1
	for i++; i < len(b) && b[i] == '"'; {
		e := shortPlain(b, i)
		if e >= 0 {
			binary.LittleEndian.PutUint64(text[n:], load64(b, i+1))
			n += e - i - 2
		} else {
			var escaped bool
			if e, escaped = scanString(b, i, nonASCII); e < 0 {
				break
			}
			if escaped {
				n = len(appendUnescaped(text[:n], b[i+1:e-1])) // in place: it fits
			} else {
				n += copy(text[n:], b[i+1:e-1])
			}
		}
		// A comma and the next string, or the end of the array.
		if e+1 < len(b) && b[e] == ',' && b[e+1] == '"' {
			i = e + 1
			continue
		}
		if e < len(b) && b[e] == ']' {
			end = e + 1
		}
		break
	}
	keep := from
	if end-start >= minSpanString {
		rec.add(jsonSpan{start: int32(start), end: int32(end)})
		keep = n
		rec.textRuns = append(rec.textRuns, tokenRun{int32(start), int32(from), int32(n)})
	}
	rec.textBuf = rec.textBuf[:keep]
	return end
}

// integerRun returns the index after the elements ",<integer>" that follow one
// another from b[j] in an array of plain integers (a token-id prompt), one
// loop iteration per element. Anything else (space, a fraction, a zero, the
// end) is left at its comma to the general path. Out of scanJSONWith: each
// function entered costs a request (docs/performance.md), and a chat body
// holds no such array.
func integerRun(b []byte, j int) int {
	for j+1 < len(b) && b[j] == ',' && b[j+1] >= '1' && b[j+1] <= '9' {
		k := j + 2
		for k < len(b) && b[k] >= '0' && b[k] <= '9' {
			k++
		}
		if k < len(b) && (b[k] == '.' || b[k]|0x20 == 'e') {
			break
		}
		j = k
	}
	return j
}

// SkipSpace returns the index of the first byte from i that is not JSON
// whitespace, or len(b). A table lookup per byte: the parser inlines it a
// few dozen times, and in Wasm each copy of a switch would be ~60
// instructions of functions every request enters.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && jsonSpace[b[i]] {
		i++
	}
	return i
}

var jsonSpace = [256]bool{' ': true, '\t': true, '\n': true, '\r': true}

// The literals' first four bytes as a little-endian word.
const (
	wordTrue = 't' | 'r'<<8 | 'u'<<16 | 'e'<<24
	wordFals = 'f' | 'a'<<8 | 'l'<<16 | 's'<<24
	wordNull = 'n' | 'u'<<8 | 'l'<<16 | 'l'<<24
)

// plainStringByte marks bytes a string may hold as they are: everything but
// the quote, the backslash and control characters.
var plainStringByte = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// simpleEscape marks the bytes that may follow a backslash other than 'u'
// (a table: in Wasm a switch on them would be ~110 instructions of
// scanString).
var simpleEscape = [256]bool{'"': true, '\\': true, '/': true, 'b': true, 'f': true, 'n': true, 'r': true, 't': true}

// shortPlain returns the index after the string starting at b[i] (a
// quote) when it closes within the 9 bytes after the quote and holds no
// escape, no control character and no byte above 0x7f; and -1 otherwise
// (the caller then scans it in full). One word test, inlined where it is
// used: keys, roles and short values are most strings of a body, and a
// call per string made a body of many of them cost tens of times a
// plain-text one in Wasm.
func shortPlain(b []byte, i int) (e int) {
	e = -1
	if i+10 <= len(b) { // and i >= 0: an index the caller has read
		// The first byte to look at among the 8 after the quote, or the
		// 9th when none of them needs a look (stopASCII's lowest flag is
		// exact).
		if k := i + 1 + bits.TrailingZeros64(stopASCII(load64(b, i+1))&highBits)>>3; b[k] == '"' {
			e = k + 1
		}
	}
	return e
}

// skipString returns the index after the string starting at b[i] (a
// quote), or -1 if it is not a valid JSON string.
func skipString(b []byte, i int) int {
	i, _ = scanString(b, i, 0)
	return i
}

// scanString is skipString that also reports whether the string holds an
// escape. With nonASCII set to the high bits of every byte it also checks
// that the string is UTF-8, and returns badUTF8 when it is not.
func scanString(b []byte, i int, nonASCII uint64) (end int, escaped bool) {
	i++
scan:
	for {
		// The next byte to look at: within 32 bytes (text with escapes,
		// where one follows another every line) found here, 8 bytes per
		// test; farther on by the long steps of plainRun.
		near := false
		for n := 0; n < 4 && i >= 0 && i+8 <= len(b); n++ {
			x := binary.LittleEndian.Uint64(b[i:])
			m := needsLook(x) | x&nonASCII
			if m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				near = true
				break
			}
			i += 8
		}
		switch {
		case near:
		case nonASCII != 0:
			i = plainRunASCII(b, i)
		default:
			i = plainRun(b, i, 0)
		}
		for i < len(b) && plainStringByte[b[i]] && (nonASCII == 0 || b[i] < utf8.RuneSelf) {
			i++
		}
		if i >= len(b) {
			break scan
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, escaped
		case c == '\\':
			escaped = true
			if i+1 >= len(b) {
				break scan
			}
			switch c := b[i+1]; {
			case simpleEscape[c]:
				i += 2
			case c == 'u':
				if !isHex4(b[i+2:]) {
					break scan
				}
				i += 6
			default:
				break scan
			}
		case c >= utf8.RuneSelf: // only when checking UTF-8
			// A run of multi-byte characters (text in most scripts other
			// than Latin is nothing else): found 8 bytes per step, and
			// checked with one utf8.Valid call (one loop) rather than a
			// utf8.DecodeRune call per character, which in Wasm costs
			// several times more for such text. A run ends at an ASCII
			// byte, which no UTF-8 sequence holds, so the run is valid
			// exactly when its characters are.
			if i = mixedRun(b, i); i < 0 {
				return badUTF8, escaped
			}
		default: // a control character
			break scan
		}
	}
	// Every failure but badUTF8 breaks out to this one return (in Wasm
	// each return is code of a function every request enters).
	return -1, escaped
}

// mixedRun steps over UTF-8 text from b[i] (a byte above 0x7f) while it
// needs no look, ASCII and multi-byte characters alike, and returns the
// index of the first quote, backslash or control character, or of a byte
// in the last 8 of b, with every character before it checked; or -1 if a
// character before that is not UTF-8. Text in most scripts mixes the two
// (spaces, digits, Latin names), and going back to plainRunASCII at each
// ASCII byte cost a few calls per run.
func mixedRun(b []byte, i int) int {
	for i >= 0 && i+8 <= len(b) {
		x := binary.LittleEndian.Uint64(b[i:])
		hi := x & highBits
		// Bytes that need a look, among the ASCII bytes before the
		// first multi-byte one (needsLook does not flag bytes above
		// 0x7f, and its lowest flag is exact).
		if m := needsLook(x); m != 0 && (hi == 0 || bits.TrailingZeros64(m) < bits.TrailingZeros64(hi)) {
			return i + bits.TrailingZeros64(m)>>3
		}
		if hi == 0 {
			i += 8
			continue
		}
		if k := bits.TrailingZeros64(hi) >> 3; k > 0 {
			i += k // the ASCII bytes before the first multi-byte one
			continue
		}
		// b[i] leads a character; the common shapes 8 bytes per test
		// as in validRun, else one character. A run of 3-byte
		// characters (CJK) goes 24 bytes per loop iteration first.
		j := i
		for j+32 <= len(b) && cjk2(binary.LittleEndian.Uint64(b[j:])) && cjk2(binary.LittleEndian.Uint64(b[j+6:])) &&
			cjk2(binary.LittleEndian.Uint64(b[j+12:])) && cjk2(binary.LittleEndian.Uint64(b[j+18:])) {
			j += 24
		}
		if j > i {
			i = j
			continue
		}
		if x&0x0000c0c0f0c0c0f0 == 0x00008080e08080e0 {
			if l0, l1 := byte(x), byte(x>>24); l0 != 0xe0 && l0 != 0xed && l1 != 0xe0 && l1 != 0xed {
				i += 6
				continue
			}
		}
		if x&0xc0e0c0e0c0e0c0e0 == 0x80c080c080c080c0 {
			const ones16 = 0x0001000100010001
			if v := x & 0x001e001e001e001e; (v-ones16)&^v&0x8000800080008000 == 0 {
				i += 8
				continue
			}
		}
		c, size := utf8.DecodeRune(b[i:])
		if c == utf8.RuneError && size == 1 {
			return -1
		}
		i += size
	}
	if i < 0 || i >= len(b) || b[i] < utf8.RuneSelf {
		return i
	}
	// The last bytes: the run there as before.
	j := nonASCIIRun(b, i)
	if !validRun(b[i:j]) {
		return -1
	}
	return j
}

// cjk2 reports whether the low 6 bytes of x are two 3-byte UTF-8
// characters with lead bytes E1-EC or EE-EF.
func cjk2(x uint64) bool {
	l0, l1 := byte(x), byte(x>>24)
	return x&0x0000c0c0f0c0c0f0 == 0x00008080e08080e0 && l0 != 0xe0 && l0 != 0xed && l1 != 0xe0 && l1 != 0xed
}

// nonASCIIRun returns the index of the first byte from i below 0x80, or
// len(b).
func nonASCIIRun(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		if m := ^binary.LittleEndian.Uint64(b[i:]) & highBits; m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(b) && b[i] >= utf8.RuneSelf; i++ {
	}
	return i
}

// validRun reports whether r, a run of bytes above 0x7f, is UTF-8 (as
// utf8.Valid does). Two common shapes go 8 bytes per test: two 3-byte
// characters (most CJK text) and four 2-byte ones (Cyrillic, Greek,
// Arabic, Hebrew...); anything else goes one character at a time.
func validRun(r []byte) bool {
	for len(r) >= 8 {
		x := binary.LittleEndian.Uint64(r)
		// Two 3-byte characters, lead bytes E1-EC or EE-EF (E0 and ED
		// restrict their second byte: the slow way).
		if x&0x0000c0c0f0c0c0f0 == 0x00008080e08080e0 {
			if l0, l1 := byte(x), byte(x>>24); l0 != 0xe0 && l0 != 0xed && l1 != 0xe0 && l1 != 0xed {
				r = r[6:]
				continue
			}
		}
		// Four 2-byte characters, lead bytes C2-DF (C0 and C1 would be
		// overlong: their bits 1-4 are zero).
		if x&0xc0e0c0e0c0e0c0e0 == 0x80c080c080c080c0 {
			const ones16 = 0x0001000100010001
			if v := x & 0x001e001e001e001e; (v-ones16)&^v&0x8000800080008000 == 0 {
				r = r[8:]
				continue
			}
		}
		c, size := utf8.DecodeRune(r)
		if c == utf8.RuneError && size == 1 {
			return false
		}
		r = r[size:]
	}
	return utf8.Valid(r)
}

// badUTF8 is scanString's end for a string that is not UTF-8.
const badUTF8 = -2

// plainRun returns the index of the first byte from i that may need a look
// in a string (a quote, a backslash or a control character, and any byte
// above 0x7f when nonASCII is set), or an index at most 7 bytes before the
// end of b when there is none. A prompt is mostly such runs, so it steps 64
// bytes at a time (128 in plainRunASCII) while none of them needs a look:
// in Go's Wasm port every loop iteration is a jump through the function's
// dispatch table, so the longer the step the less that costs
// (BenchmarkDecideNative's "validate" cases measure it). Then it steps 8,
// and in the word that holds the byte it finds that byte from the word's
// mask, so the caller's byte loop only ever sees a string's last few bytes.
func plainRun(b []byte, i int, nonASCII uint64) int {
	if nonASCII != 0 {
		return plainRunASCII(b, i)
	}
	if i < 0 || i > len(b) {
		return i
	}
	r := b[i:]
	// Most strings are short (keys, names): their end is in the first
	// word, found before the long steps' setup.
	if len(r) >= 8 {
		if m := needsLook(binary.LittleEndian.Uint64(r)); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		r = r[8:]
	}
	for len(r) >= 64 {
		w := r[:64]
		x0, x1 := binary.LittleEndian.Uint64(w), binary.LittleEndian.Uint64(w[8:])
		x2, x3 := binary.LittleEndian.Uint64(w[16:]), binary.LittleEndian.Uint64(w[24:])
		x4, x5 := binary.LittleEndian.Uint64(w[32:]), binary.LittleEndian.Uint64(w[40:])
		x6, x7 := binary.LittleEndian.Uint64(w[48:]), binary.LittleEndian.Uint64(w[56:])
		if needsLook(x0)|needsLook(x1)|needsLook(x2)|needsLook(x3)|
			needsLook(x4)|needsLook(x5)|needsLook(x6)|needsLook(x7) != 0 {
			break
		}
		r = r[64:]
	}
	for len(r) >= 8 {
		if m := needsLook(binary.LittleEndian.Uint64(r)); m != 0 {
			return len(b) - len(r) + bits.TrailingZeros64(m)>>3
		}
		r = r[8:]
	}
	return len(b) - len(r)
}

// plainRunASCII is plainRun for strings that must also stop at every byte
// above 0x7f. With those excluded the test is shorter than needsLook's (see
// stopASCII).
func plainRunASCII(b []byte, i int) int {
	if i < 0 || i > len(b) {
		return i
	}
	r := b[i:]
	if len(r) >= 8 { // as in plainRun
		if m := stopASCII(binary.LittleEndian.Uint64(r)) & highBits; m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		r = r[8:]
	}
	for len(r) >= 128 {
		w := r[:128]
		m := stopASCII(binary.LittleEndian.Uint64(w)) | stopASCII(binary.LittleEndian.Uint64(w[8:])) |
			stopASCII(binary.LittleEndian.Uint64(w[16:])) | stopASCII(binary.LittleEndian.Uint64(w[24:])) |
			stopASCII(binary.LittleEndian.Uint64(w[32:])) | stopASCII(binary.LittleEndian.Uint64(w[40:])) |
			stopASCII(binary.LittleEndian.Uint64(w[48:])) | stopASCII(binary.LittleEndian.Uint64(w[56:]))
		m |= stopASCII(binary.LittleEndian.Uint64(w[64:])) | stopASCII(binary.LittleEndian.Uint64(w[72:])) |
			stopASCII(binary.LittleEndian.Uint64(w[80:])) | stopASCII(binary.LittleEndian.Uint64(w[88:])) |
			stopASCII(binary.LittleEndian.Uint64(w[96:])) | stopASCII(binary.LittleEndian.Uint64(w[104:])) |
			stopASCII(binary.LittleEndian.Uint64(w[112:])) | stopASCII(binary.LittleEndian.Uint64(w[120:]))
		if m&highBits != 0 {
			break
		}
		r = r[128:]
	}
	// The last 127 bytes, or the 128 that hold the byte, 8 per step: no
	// 64-byte steps in between, which would save a few steps once per
	// string and cost ~700 bytes of a function every request enters.
	for len(r) >= 8 {
		if m := stopASCII(binary.LittleEndian.Uint64(r)) & highBits; m != 0 {
			return len(b) - len(r) + bits.TrailingZeros64(m)>>3
		}
		r = r[8:]
	}
	return len(b) - len(r)
}

const highBits = 0x8080808080808080

// stopASCII has, under highBits, a byte's high bit set where that byte of x
// is a quote, a backslash, a control character or above 0x7f, and possibly
// in bytes above (at higher addresses than) such a byte, never in a word
// without one: so the lowest set high bit is the first byte to look at.
// As in needsLook, x^0x02 maps the quote to 0x20 and keeps control
// characters below it, so subtracting 0x21 borrows from exactly those bytes,
// and the backslash is the zero byte of x^0x5c that subtracting 1 borrows
// from. A byte above 0x7f is flagged by x itself, so unlike needsLook no
// mask has to stop such bytes from looking like borrows; and a borrow
// starts only at a flagged byte.
func stopASCII(x uint64) uint64 {
	const ones = 0x0101010101010101
	return ((x ^ 0x02*ones) - 0x21*ones) | ((x ^ '\\'*ones) - ones) | x
}

// needsLook is nonzero when one of the eight bytes in x is a quote, a
// backslash or a control character (SWAR; bytes >= 0x80, UTF-8, are plain).
// x^0x02 maps the quote (0x22) to 0x20 and keeps control characters below
// 0x20 while every other byte stays at 0x21 or above, so one "below 0x21"
// test covers both; the backslash is a zero byte of x^0x5c. Each test sets a
// byte's high bit where its condition may hold (a borrow can also mark the
// bytes above a true hit, never a word without one).
func needsLook(x uint64) uint64 {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	y := x ^ (0x02 * ones)
	z := x ^ ('\\' * ones)
	return ((y-0x21*ones)&^y | (z-ones)&^z) & highs
}

// isHex4 reports whether h starts with four hex digits: four table
// lookups ANDed, after one length test that spares their bounds checks.
// scanString inlines it, and in Wasm a bounds check and a branch per digit
// would be ~40 instructions each of a function every request enters.
func isHex4(h []byte) bool {
	if len(h) < 4 {
		return false
	}
	return hexDigit[h[0]]&hexDigit[h[1]]&hexDigit[h[2]]&hexDigit[h[3]] != 0
}

// hexDigit is 1 for the hex digits, 0 for every other byte.
var hexDigit = func() (t [256]uint8) {
	for _, c := range "0123456789abcdefABCDEF" {
		t[c] = 1
	}
	return t
}()

// skipNumber returns the index after the number starting at b[i], or -1.
func skipNumber(b []byte, i int) int {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		i++
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == start {
			return -1
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == start {
			return -1
		}
	}
	return i
}
