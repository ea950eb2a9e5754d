package openai

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
	"unsafe"

	"github.com/tidwall/gjson"
)

// A small walker over JSON that validJSON has accepted. gjson remains the
// reader of values (numbers, escaped strings, nested lookups in small
// objects); the walker only finds where each member or element starts and
// ends. gjson finds the same spans byte by byte, which on long prompts
// would be most of the filter's time in Wasm.
// With the span table of the validating pass the walker steps over long
// strings and containers in one lookup; without it, it skips strings 32
// bytes at a time.

// jsonDoc is a validated body with the span table its validating pass
// built (see jsonSpans): the pass fills the doc's own table, so that a
// parser that reuses one doc stores no pointer per body (in Wasm each
// pointer stored into the heap is a write barrier's code). A nil *jsonDoc
// walks by scanning alone; so does a value outside the table (short
// strings, numbers, literals).
type jsonDoc struct {
	jsonSpans
	// base is the cap of the body: a view v of it starts at offset
	// base-cap(v). An offset rather than the body, which the doc would
	// keep from the garbage collector after the request.
	base int
	next int // index in spans of the value after the last one found: walks go mostly forward

	// unesc holds the unescaped text of the escaped strings read so far
	// (see text): appended to, never overwritten, so every string text
	// returned stays valid until the doc's owner reuses the buffer for
	// the next body.
	unesc []byte
}

// find returns the span table entry of the value starting at v[0]. v must
// be a view of the doc's body (so cap tells its offset).
func (d *jsonDoc) find(v []byte) (jsonSpan, bool) {
	if d == nil || len(d.spans) == 0 {
		return jsonSpan{}, false
	}
	pos := int32(d.base - cap(v))
	if n := d.next; n < len(d.spans) && d.spans[n].start == pos {
		d.next = n + 1
		return d.spans[n], true
	}
	return d.search(pos)
}

// nextSpan is find's first test alone, small enough to be inlined: whether
// the value starting at v[0] is the table's next entry, which it is for
// every long string and container of a walk that goes forward.
func (d *jsonDoc) nextSpan(v []byte) (jsonSpan, bool) {
	if d != nil && d.next < len(d.spans) && d.spans[d.next].start == int32(d.base-cap(v)) {
		d.next++
		return d.spans[d.next-1], true
	}
	return jsonSpan{}, false
}

// lastSpan is nextSpan for the entry the walk found last: text reads a
// string that the walk has just stepped over, and finds it here without a
// call to find.
func (d *jsonDoc) lastSpan(v []byte) (jsonSpan, bool) {
	if d != nil && d.next > 0 && d.next <= len(d.spans) && d.spans[d.next-1].start == int32(d.base-cap(v)) {
		return d.spans[d.next-1], true
	}
	return jsonSpan{}, false
}

// search is find's binary search, for a walk that does not go forward.
func (d *jsonDoc) search(pos int32) (jsonSpan, bool) {
	lo, hi := 0, len(d.spans)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if d.spans[m].start < pos {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(d.spans) && d.spans[lo].start == pos {
		d.next = lo + 1
		return d.spans[lo], true
	}
	return jsonSpan{}, false
}

// tokens returns the token ids the validating pass read from the array
// starting at v[0] (see tokenRun), or false when it read none there (a
// short array, or one that holds anything but token ids).
func (d *jsonDoc) tokens(v []byte) ([]uint32, bool) {
	if r, ok := d.run(d.runs, v); ok {
		return d.ids[r.from:r.to], true
	}
	return nil, false
}

// texts is tokens for the text of an array of strings (see stringArray).
func (d *jsonDoc) texts(v []byte) ([]byte, bool) {
	if r, ok := d.run(d.textRuns, v); ok {
		return d.textBuf[r.from:r.to], true
	}
	return nil, false
}

// run returns the entry of runs for the array starting at v[0].
func (d *jsonDoc) run(runs []tokenRun, v []byte) (tokenRun, bool) {
	pos := int32(d.base - cap(v))
	lo, hi := 0, len(runs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if runs[m].start < pos {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(runs) && runs[lo].start == pos {
		return runs[lo], true
	}
	return tokenRun{}, false
}

// numberByte marks the bytes a JSON number may hold.
var numberByte = [256]bool{'0': true, '1': true, '2': true, '3': true, '4': true, '5': true, '6': true,
	'7': true, '8': true, '9': true, '-': true, '+': true, '.': true, 'e': true, 'E': true}

func (d *jsonDoc) skip(b []byte, i int) int {
	e := -1 // the value's end: one return, as in member
	if i >= len(b) {
		return e
	}
	switch c := b[i]; {
	case c == '"' || c == '{' || c == '[':
		// The table's next entry, a short string (which the table does
		// not hold), the whole table, and only then a full scan. One
		// copy of the lookups for strings and containers: in Wasm each
		// inlined copy is code every request enters.
		if s, ok := d.nextSpan(b[i:]); ok && i+int(s.end-s.start) <= len(b) {
			e = i + int(s.end-s.start)
		}
		if e < 0 && c == '"' {
			e = shortString(b, i)
		}
		if k := SkipSpace(b, i+1); e < 0 && c != '"' && k < len(b) && b[k] == c+2 {
			e = k + 1 // an empty container, which the table does not hold
		}
		if e < 0 {
			if s, ok := d.find(b[i:]); ok && i+int(s.end-s.start) <= len(b) {
				e = i + int(s.end-s.start)
			}
		}
		if e < 0 {
			if c == '"' {
				e = skipString(b, i)
			} else {
				e = skipContainer(b, i)
			}
		}
	case c == '-' || (c >= '0' && c <= '9'):
		e = numberEnd(b, i)
	case c == 't' || c == 'n':
		e = i + 4
	case c == 'f':
		e = i + 5
	}
	return e
}

// skipContainer returns the index after the object or array starting at
// b[i], scanning it: skip's way for a container the span table does not
// hold (no table).
func skipContainer(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			if i = skipString(b, i); i < 0 {
				return -1
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
		i++
	}
	return -1
}

// members calls fn with the raw key (quotes included) and raw value of
// each member of the object obj, in order, until fn returns false.
func (d *jsonDoc) members(obj []byte, fn func(key, val []byte) bool) {
	for i := SkipSpace(obj, 1); ; {
		key, val, next, ok := d.member(obj, i)
		if !ok || !fn(key, val) {
			return
		}
		i = next
	}
}

// member returns the member of the object obj whose key starts at obj[i] (i is
// SkipSpace(obj, 1) for the first member, next of the previous one after
// that): its raw key (quotes included) and raw value, and where the next
// member starts. ok is false past the last member. The parser loops over it
// rather than passing a callback to members: each callback would be an
// indirect call into a function of its own, and each function entered costs a
// request (docs/performance.md).
func (d *jsonDoc) member(obj []byte, i int) (key, val []byte, next int, ok bool) {
	k, v, e := -1, 0, -1 // the key's end, and the value's start and end
	if i < len(obj) && obj[i] == '"' {
		// A key is never in the table: quickEnd ends a short one, and
		// skip scans any other.
		if k = quickEnd(obj, i); k < 0 {
			k = d.skip(obj, i)
		}
	}
	if k >= 0 {
		v = SkipSpace(obj, SkipSpace(obj, k)+1) // past ':'
		if e = quickEnd(obj, v); e < 0 {
			e = d.skip(obj, v)
		}
	}
	if e < 0 { // one return for all ends of the walk: in Wasm each is code
		return nil, nil, i, false
	}
	next = SkipSpace(obj, e)
	if next < len(obj) && obj[next] == ',' {
		next = SkipSpace(obj, next+1)
	}
	return obj[i:k], obj[v:e], next, true
}

// elements calls fn with each raw element of the array arr until fn
// returns false.
func (d *jsonDoc) elements(arr []byte, fn func(val []byte) bool) {
	for i := SkipSpace(arr, 1); ; {
		val, next, ok := d.element(arr, i)
		if !ok || !fn(val) {
			return
		}
		i = next
	}
}

// element is member for the array arr: the raw element starting at arr[i]
// (SkipSpace(arr, 1) for the first) and where the next one starts, or ok
// false past the last.
func (d *jsonDoc) element(arr []byte, i int) (val []byte, next int, ok bool) {
	e := -1 // the element's end
	if i < len(arr) && arr[i] != ']' {
		if e = quickEnd(arr, i); e < 0 {
			e = d.skip(arr, i)
		}
	}
	if e < 0 { // one return for both ends of the walk, as in member
		return nil, i, false
	}
	next = SkipSpace(arr, e)
	if next < len(arr) && arr[next] == ',' {
		next = SkipSpace(arr, next+1)
	}
	return arr[i:e], next, true
}

// quickEnd is skip for the small values walks meet most, none of which
// the span table holds: a string of up to 9 plain bytes (most keys and
// short values) and a number; -1 for any other value (the caller then
// calls skip). Much smaller than skip, whose lookups a body of many small
// values paid for at each one.
func quickEnd(b []byte, i int) (e int) {
	e = -1
	if i < len(b) {
		if c := b[i]; c == '"' {
			// The word test may read past the end of b, a view of the
			// body (b[:cap(b)] is the body's buffer): a short string at
			// the end of a small object (a message's content) ends within
			// b all the same, and without it went to skip.
			e = shortPlain(b[:cap(b)], i)
		} else if c-'0' <= 9 {
			e = numberEnd(b, i)
		}
	}
	return e
}

// numberEnd returns the index after the number starting at b[i]: valid
// JSON, so the first byte no number holds.
func numberEnd(b []byte, i int) int {
	for i++; i < len(b) && numberByte[b[i]]; i++ {
	}
	return i
}

// shortString returns the index after the string starting at b[i] (a
// quote) when it ends within minSpanString bytes, and -1 otherwise (the
// caller then looks it up in the span table, or scans it in full). Eight
// bytes per step (needsLook finds the first byte to look at), an escape
// stepped over whole and the search going on by words after it: escaped
// JSON in a string (a tool call's arguments, "{\"city\": ...}") has an
// escape every few bytes. For a short string cheaper than the full scan's
// setup, and a short string with an escape (a URL's "\/", a "\n") is
// never in the table, whose binary search it paid for each time.
// b must be valid JSON from i on: the byte after a backslash is never
// the string's end.
func shortString(b []byte, i int) int {
	j := i + 1 // b[j:] is what is left to look at
	end := j + minSpanString
	if j < 0 || end < 0 || j > len(b) {
		return -1
	}
	if end > len(b) {
		end = len(b)
	}
	for j < end {
		if j+8 <= len(b) {
			// needsLook's lowest flag is exact: b[j] is then the first
			// byte to look at (past end when the string ends later).
			m := needsLook(binary.LittleEndian.Uint64(b[j:]))
			if m == 0 {
				j += 8
				continue
			}
			if j += bits.TrailingZeros64(m) >> 3; j >= end {
				break
			}
		}
		switch c := b[j]; {
		case c == '"':
			return j + 1
		case c == '\\':
			j += 2 // and the escaped byte (a \u escape's hex digits are no quote)
		case c < 0x20:
			return -1
		default:
			j++ // the last bytes of b, one at a time
		}
	}
	return -1
}

// hasBackslash reports whether b holds a backslash, eight bytes per step.
func hasBackslash(b []byte) bool {
	const ones = 0x0101010101010101
	for len(b) >= 8 {
		if z := binary.LittleEndian.Uint64(b) ^ ('\\' * ones); (z-ones)&^z&(0x80*ones) != 0 {
			return true
		}
		b = b[8:]
	}
	for _, c := range b {
		if c == '\\' {
			return true
		}
	}
	return false
}

// jsonType classifies a raw value by its first byte. A table lookup rather
// than a switch: the parser inlines it a dozen times into functions every
// request enters, and in Wasm each copy of the switch would be ~80
// instructions.
func jsonType(v []byte) gjson.Type {
	if len(v) == 0 {
		return gjson.Null
	}
	return jsonTypeOf[v[0]]
}

// jsonTypeOf is jsonType by first byte: a number for every byte JSON does
// not start another value with.
var jsonTypeOf = func() (t [256]gjson.Type) {
	for c := range t {
		t[c] = gjson.Number
	}
	t['"'], t['t'], t['f'], t['n'], t['{'], t['['] = gjson.String, gjson.True, gjson.False, gjson.Null, gjson.JSON, gjson.JSON
	return t
}()

// stringOf returns the text of a raw JSON string. Without escapes it is a
// view of the body (no copy: the hasher consumes it before the body goes);
// with escapes a copy, unescaped as gjson unescapes.
func stringOf(raw []byte) string {
	var d jsonDoc // no table, and a buffer of its own
	return d.text(raw)
}

// text is stringOf that takes whether a long string holds escapes from the
// span table instead of searching it again, and unescapes into the doc's
// buffer (so d must not be nil).
func (d *jsonDoc) text(raw []byte) string {
	inner := raw[1 : len(raw)-1]
	escaped := false
	if len(raw) < minSpanString { // never in the table
		// A byte loop over a few dozen bytes at most (keys, roles,
		// names): no call, where text is called for every key and
		// short value a request reads.
		for _, c := range inner {
			if c == '\\' {
				escaped = true
				break
			}
		}
	} else if s, ok := d.lastSpan(raw); ok {
		escaped = s.escaped
	} else if s, ok := d.find(raw); ok {
		escaped = s.escaped
	} else {
		escaped = hasBackslash(inner)
	}
	if escaped && len(inner) == 2 && unescapedByte[inner[1]] != 0 {
		// One escape alone ("\n", "\\"): its byte in unescapedText,
		// without unescape's call and the copy into the buffer.
		u := int(unescapedByte[inner[1]])
		inner, escaped = unsafe.Slice(unsafe.StringData(unescapedText[u:]), 1), false
	}
	if escaped { // the text is the unescaped copy
		inner = d.unescape(inner)
	}
	return unsafeString(inner) // one return: in Wasm each is code of its own
}

// unescapedText holds every byte at its own index: text's string of one
// byte an escape stands for is a view of it.
const unescapedText = "\x00\x01\x02\x03\x04\x05\x06\x07\x08\t\n\x0b\x0c\r\x0e\x0f" +
	"\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f" +
	" !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]"

// unescape returns the text of the inner bytes of a valid JSON string with
// escapes, appended to the doc's buffer. Out of text, which every request
// enters for keys and short values without escapes (not inlined there:
// it is ~500 bytes of Wasm).
//
//go:noinline
func (d *jsonDoc) unescape(inner []byte) []byte {
	n := len(d.unesc)
	if cap(d.unesc)-n < len(inner)+8 { // as appendUnescaped needs, so that it does not grow it again
		d.unesc = growText(d.unesc, len(inner)+8)
	}
	// d.unesc is resliced, not assigned: only its length is stored, where
	// storing its pointer is a write barrier's test and, while the
	// collector runs, its call.
	out, m := d.unesc[:cap(d.unesc)], n
	if len(inner) <= 8 {
		// A short string (a key, a name, a short value with an escape
		// or two): byte by byte, without appendUnescaped's call and its
		// word loops; a \u escape goes there.
		for k := 0; k < len(inner); k++ {
			c := inner[k]
			if c == '\\' {
				if c = unescapedByte[inner[k+1]]; c == 0 {
					m = -1
					break
				}
				k++
			}
			out[m] = c
			m++
		}
	} else {
		m = -1
	}
	if m < 0 {
		m = len(appendUnescaped(d.unesc, inner))
	}
	d.unesc = d.unesc[:m]
	return d.unesc[n:]
}

// appendUnescaped appends to dst the text of the inner bytes of a valid
// JSON string, decoded exactly as gjson decodes it (a \u escape of half a
// surrogate pair takes the \u escape after it as the other half, and
// decodes to U+FFFD when the two are no pair or there is none). Real
// prompts nearly always hold escapes (every newline is one, and every
// character other than ASCII as json.dumps writes it by default), and
// gjson's byte-at-a-time unescape and its copies cost several times more
// in Wasm. Here everything is written by whole words, with no call.
func appendUnescaped(dst, s []byte) []byte {
	const ones = 0x0101010101010101
	// out[:n] is the text so far, written by index into a buffer grown
	// first: a text is never longer than its escaped form, so n never
	// passes the start of the bytes of s yet to read (relative to where
	// the text started), and with 8 bytes more a word stored at n always
	// fits. Words are stored ahead of the text, and what passes its end
	// is written over next.
	n, out := len(dst), dst
	if cap(out)-n < len(s)+8 {
		out = growText(out, len(s)+8)
	}
	out = out[:cap(out)]
	// s and out read and written by word without a bounds test per word
	// (loadAt, storeAt), the indexes covered by the loop conditions and a
	// test of out's length per run.
	sp, op := unsafe.Pointer(unsafe.SliceData(s)), unsafe.Pointer(unsafe.SliceData(out))
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			// A run of plain bytes: each word stored where its bytes go,
			// then searched for a backslash (a copy per run cost a call
			// in Wasm); s[k] goes to out[o+k].
			k, o := i, n-i
			_ = out[o+len(s)+7] // out[o+i : o+len(s)+8], as n+8 <= o+i+8
			for k+16 <= len(s) {
				x, y := loadAt(sp, k), loadAt(sp, k+8)
				storeAt(op, o+k, x)
				storeAt(op, o+k+8, y)
				if backslashes(x)|backslashes(y) != 0 {
					break
				}
				k += 16
			}
			for k+8 <= len(s) {
				x := loadAt(sp, k)
				storeAt(op, o+k, x)
				if m := backslashes(x); m != 0 {
					k += bits.TrailingZeros64(m) >> 3
					goto escape
				}
				k += 8
			}
			if k < len(s) && len(s) >= 8 {
				// Fewer than 8 bytes left: the last word of s, shifted
				// down to them (the zeros shifted in are no backslash).
				x := loadAt(sp, len(s)-8) >> (64 - 8*uint(len(s)-k))
				storeAt(op, o+k, x)
				if m := backslashes(x); m != 0 {
					k += bits.TrailingZeros64(m) >> 3
				} else {
					k = len(s)
				}
			}
			for k < len(s) && s[k] != '\\' {
				out[o+k] = s[k]
				k++
			}
		escape:
			n, i = o+k, k
		}
		if i+1 >= len(s) {
			break // the end (i+1 == len(s) is not reached: s is valid)
		}
		if u := unescapedByte[s[i+1]]; u != 0 {
			out[n] = u
			n, i = n+1, i+2
			// Escapes that follow one another ("\n\n\n\n"), four per
			// step: the backslashes tested together, the four escaped
			// bytes looked up and their product tested for a zero (no
			// \u escape among them), and written as one word.
			for i+8 <= len(s) && loadAt(sp, i)&0x00ff00ff00ff00ff == '\\'*0x0001000100010001 {
				x := loadAt(sp, i)
				u0, u1, u2, u3 := unescapedByte[byte(x>>8)], unescapedByte[byte(x>>24)], unescapedByte[byte(x>>40)], unescapedByte[byte(x>>56)]
				if uint32(u0)*uint32(u1)*uint32(u2)*uint32(u3) == 0 {
					break
				}
				_ = out[n+3]
				storeAt32(op, n, uint32(u0)|uint32(u1)<<8|uint32(u2)<<16|uint32(u3)<<24)
				n, i = n+4, i+8
			}
			continue
		}
		if s[i+1] != 'u' || i+6 > len(s) {
			break // not reached: s is valid
		}
		// \u escapes, as many as follow one another (text other than
		// ASCII from json.dumps is nothing else), each written as UTF-8
		// in one word.
		for {
			if i+16 <= len(s) {
				// Two escapes of 3-byte characters (CJK text) in one
				// step: their eight hex digits read as one word and both
				// characters' UTF-8 written as one.
				x, y := loadAt(sp, i), loadAt(sp, i+8)
				if uint16(x>>48) == '\\'|'u'<<8 {
					v := hex8(x>>16&0xffffffff | y<<32)
					if f1, f2 := v&0xf800, v>>32&0xf800; f1 != 0 && f1 != 0xd800 && f2 != 0 && f2 != 0xd800 {
						t := 0x008080e0008080e0 | v>>12&0x0000000f0000000f | v>>6&0x0000003f0000003f<<8 | v&0x0000003f0000003f<<16
						_ = out[n+7]
						storeAt(op, n, t&0xffffff|t>>32<<24)
						n, i = n+6, i+12
						if i+6 > len(s) || uint16(y>>32) != '\\'|'u'<<8 {
							break
						}
						continue
					}
				}
			}
			r := hexWord(loadAt32(sp, i+2)) // i+6 <= len(s)
			i += 6
			_ = out[n+3]
			switch {
			case r < 0x80:
				out[n] = byte(r)
				n++
			case r < 0x800:
				storeAt32(op, n, 0x80c0|r>>6|r&0x3f<<8)
				n += 2
			case r&0xf800 != 0xd800: // no surrogate
				storeAt32(op, n, 0x8080e0|r>>12|r>>6&0x3f<<8|r&0x3f<<16)
				n += 3
			default:
				// Half a surrogate pair: the \u escape after it, if any,
				// is the other half (as gjson reads it, whatever it is).
				r2 := uint32(0)
				if i+6 <= len(s) && loadAt16(sp, i) == '\\'|'u'<<8 {
					r2 = hexWord(loadAt32(sp, i+2))
					i += 6
				}
				if r < 0xdc00 && r2&0xfc00 == 0xdc00 {
					r = 0x10000 + (r-0xd800)<<10 + (r2 - 0xdc00)
					storeAt32(op, n, 0x808080f0|r>>18|r>>12&0x3f<<8|r>>6&0x3f<<16|r&0x3f<<24)
					n += 4
				} else {
					storeAt32(op, n, 0xbdbfef) // U+FFFD, as utf16.DecodeRune and utf8.EncodeRune
					n += 3
				}
			}
			if i+6 > len(s) || loadAt16(sp, i) != '\\'|'u'<<8 {
				break
			}
		}
	}
	return out[:n]
}

// backslashes has the high bit of each byte of x that is a backslash, up
// to the first (a borrow may set the bits of bytes after it).
func backslashes(x uint64) uint64 {
	const ones = 0x0101010101010101
	z := x ^ ('\\' * ones)
	return (z - ones) &^ z & (0x80 * ones)
}

// growText returns b with room for n more bytes. Out of appendUnescaped,
// which every request with an escaped string enters.
//
//go:noinline
func growText(b []byte, n int) []byte { return slices.Grow(b, n) }

// unescapedByte is the byte each escape other than \u stands for (0 for
// the others).
var unescapedByte = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// hex4 reads the four hex digits at s[i:] (the validator has checked
// them) with word arithmetic: a digit's value is its low four bits, plus
// 9 for a letter (bit 6 set), and the four values are packed two by two.
func hex4(s []byte, i int) uint32 { return hexWord(load32(s, i)) }

// hex8 is hexWord for two escapes' digits in one word: the first's value
// in its low 16 bits, the second's in bits 32 to 47.
func hex8(x uint64) uint64 {
	v := x&0x0f0f0f0f0f0f0f0f + 9*(x>>6&0x0101010101010101)
	v = (v<<4 | v>>8) & 0x00ff00ff00ff00ff
	return (v<<8 | v>>16) & 0x0000ffff0000ffff
}

// hexWord is hex4 for the four digits as a little-endian word.
func hexWord(x uint32) uint32 {
	v := x&0x0f0f0f0f + 9*(x>>6&0x01010101)
	v = (v<<4 | v>>8) & 0x00ff00ff
	return v&0xff<<8 | v>>16
}

// keySet is the member names one kind of object is read for (a request,
// a message, a content part, a tool call), found by object with one
// table lookup per member: a perfect hash of the key's first and last
// eight bytes and its length picks the one name it can be, and one
// comparison of those words (and of the bytes, past 16) settles it. A key
// that is no name of the set, most keys of a body of unused members,
// costs that one lookup and no loop over the names.
type keySet struct {
	slots [64]keySlot
	magic uint64
	// decoded has bit f when name f also matches a key spelled with
	// escapes ("mod\u0065l"), as the engines' JSON decoders read it; the
	// others match only as written. first has bit f when the first member
	// named f wins rather than the last (gjson's lookups).
	decoded, first uint64
	// The lengths of an escaped spelling worth decoding: a name's escaped
	// spelling is longer than the name (an escape is at least 2 bytes for
	// 1) and at most 6 bytes per byte of it.
	minEscaped, maxEscaped int
	// decodedLens has bit n when a name decoded matches is n bytes long:
	// key rejects a key of \u escapes whose text is no such length
	// without decoding it.
	decodedLens uint64
}

// keyNameMax bounds the length of a key set's names (decodedName decodes
// a key into an array of that length).
const keyNameMax = 32

type keySlot struct {
	n      int // -1: empty
	f      int
	lo, hi uint64
	name   string
}

// keyHash is the slot of a key of n bytes whose first and last eight are
// lo and hi (see keyWords).
func keyHash(lo, hi uint64, n int, magic uint64) int {
	return int(((lo ^ hi*0x9e3779b97f4a7c15 ^ uint64(n)) * magic) >> 58)
}

// keyWords returns the first eight bytes of the key b[i:i+n] (the bytes
// past it zero) and, for a key longer than eight, its last eight. b may
// extend past the key (the body around it): one load per word where it
// does.
func keyWords(b []byte, i, n int) (lo, hi uint64) {
	if n > 8 {
		return load64(b, i), load64(b, i+n-8)
	}
	if i+8 <= len(b) {
		return load64(b, i) & (^uint64(0) >> (64 - 8*uint(n))), 0
	}
	for k := n - 1; k >= 0; k-- {
		lo = lo<<8 | uint64(b[i+k])
	}
	return lo, 0
}

// newKeySet builds the set of names (f is a name's index), with the
// names of decoded matching escaped keys and those of first the first
// member of the name.
func newKeySet(names []string, decoded, first []string) *keySet {
	s := &keySet{minEscaped: math.MaxInt}
	for _, d := range decoded {
		s.minEscaped = min(s.minEscaped, len(d)+1)
		s.decoded |= 1 << slices.Index(names, d)
		s.maxEscaped = max(s.maxEscaped, 6*len(d))
		s.decodedLens |= 1 << len(d)
	}
	for _, d := range first {
		s.first |= 1 << slices.Index(names, d)
	}
	// object takes a key with a byte above 0x7f or an escape other than
	// \u for one that names none of the set: so a name holds only ASCII
	// letters and '_'.
	for _, name := range names {
		if len(name) > keyNameMax {
			panic("openai: key set name " + name + " is longer than keyNameMax")
		}
		for _, c := range []byte(name) {
			if !nameByte(c) {
				panic("openai: key set name " + name + " holds a byte other than an ASCII letter or '_'")
			}
		}
	}
	// The first multiplier from a fixed sequence under which no two names
	// share a slot: a few tries for a dozen names in 64 slots.
	for x := uint64(1); ; x++ {
		s.magic = (x*0x9e3779b97f4a7c15 ^ x>>7) | 1
		for k := range s.slots {
			s.slots[k].n = -1
		}
		ok := true
		for f, name := range names {
			lo, hi := keyWords([]byte(name), 0, len(name))
			k := &s.slots[keyHash(lo, hi, len(name), s.magic)]
			if k.n >= 0 {
				ok = false
				break
			}
			*k = keySlot{n: len(name), f: f, lo: lo, hi: hi, name: name}
		}
		if ok {
			return s
		}
	}
}

// nameByte reports whether c may be in a key set's name: an ASCII letter
// or '_' (see newKeySet).
func nameByte(c byte) bool { return c|0x20 >= 'a' && (c|0x20 <= 'z' || c == '_') }

// mayDecode reports whether an escaped key of n bytes between its quotes
// may decode to a name s matches decoded (see minEscaped).
func (s *keySet) mayDecode(n int) bool { return n >= s.minEscaped && n <= s.maxEscaped }

// name returns the index of the key b[i:i+n] in s, or -1. object has
// its own copy for the short keys of compact members, without a call.
func (s *keySet) name(b []byte, i, n int) int {
	var lo, hi uint64
	if n <= 8 && i+8 <= len(b) {
		lo = load64(b, i) & (^uint64(0) >> (64 - 8*uint(n))) // keyWords' first case, without its call
	} else {
		lo, hi = keyWords(b, i, n)
	}
	k := &s.slots[keyHash(lo, hi, n, s.magic)]
	if k.n != n || k.lo != lo || k.hi != hi || (n > 16 && !is(unsafeString(b[i:i+n]), k.name)) {
		return -1
	}
	return k.f
}

// object reads the members of the object whose opening brace is at b[i]
// for the names of set, in one call: where the value of member f is in b
// goes to out[f] (the last or, for set.first, the first of that name;
// offsets, not a slice of b: a pointer stored through out is a write
// barrier's test and, while the collector runs, its call), plain gets
// bit f when that value is a short string without escapes (its text is its
// bytes inside the quotes, so the caller needs no call to text), and
// other counts the members named f >= len(out). It returns the index after
// the closing brace, or -1 (not reached: b is valid JSON).
//
// One function per object, rather than member per member and fieldOf per
// key: the keys, the colon and the short values of a compact member are
// read with a word test each and no call, where a call per member and
// per key made a body of tiny messages or parts cost dozens of times a
// plain-text one in Wasm.
//
// Measure every shape after any change here, alternated with the module
// before it: each jump of the function goes through its dispatch loop,
// which carries the Go registers it uses (R0 to R14 in `GOOS=wasip1
// GOARCH=wasm go build -gcflags=-S ./openai`), and a change moves every
// member's cost in wazero by tens of percent, on paths it does not touch
// too (a span table lookup added to the loop's fast path made tiny
// messages 1.2-1.6 times slower; the same lookup after the key test, with
// the shifts by f masked so as to need no select for f >= 64, made tool
// calls 10% faster).
func (d *jsonDoc) object(b []byte, i int, set *keySet, out []valueSpan) (end int, plain uint64, other int) {
	d.nextSpan(b[i:]) // the object's table entry, if any, is passed by
	all := b[:cap(b)] // word tests may read past b (the rest of the body)
	i = SkipSpace(b, i+1)
	for i < len(b) && b[i] == '"' {
		f, v, e, short := -1, 0, -1, false // the key's name in set, and the value's start and end
		if i+64 <= len(all) {
			// The compact member of a short plain key (up to 16 bytes,
			// found by two word tests) and its colon right after it, read
			// with one test for the quote and the colon and one for the
			// name, and its value when it is a short plain string: most
			// members of a body of small objects.
			n := plainLen(load64(all, i+1), load64(all, i+9))
			if q := i + 1 + n; uint16(all[q])|uint16(all[q+1])<<8 == '"'|':'<<8 {
				lo, hi := load64(all, i+1)&(^uint64(0)>>(64-8*uint(min(n, 8)))), uint64(0)
				if n > 8 {
					hi = load64(all, q-8)
				}
				if s := &set.slots[keyHash(lo, hi, n, set.magic)]; s.n == n && s.lo == lo && s.hi == hi {
					f = s.f
				}
				if v = q + 2; all[v] == ' ' {
					v++ // ": ", as Python's json.dumps writes it
				}
				switch w := uint16(all[v]) | uint16(all[v+1])<<8; {
				case w&0xff == '"':
					if m := v + 1 + plainLen(load64(all, v+1), load64(all, v+9)); all[m] == '"' {
						e, short = m+1, true
					} else if all[m] == '\\' {
						// Up to two escapes, each followed by up to 8 bytes
						// without a quote, a backslash or a control character
						// (any above 0x7f), before the closing quote ("\\",
						// "...\n", "\n日", "\u00e9", "\ud83d\ude00a"): k
						// steps over each backslash and the byte after it (a
						// \u escape's hex digits are plain bytes), so it is
						// never on an escaped byte, and a quote there ends
						// the string. m+24 is within the guard above (m is
						// at most i+37); the string is shorter than
						// minSpanString, so not in the span table.
						w := all[m : m+24] // one bounds check for the reads below
						k := 2 + bits.TrailingZeros64(needsLook(load64(w, 2)))>>3
						if w[k] == '\\' {
							k += 2 + bits.TrailingZeros64(needsLook(load64(w, k+2)))>>3
						}
						if w[k] == '"' {
							e = m + k + 1
						}
					}
				case w == 'n'|'u'<<8:
					e = v + 4 // null ("content": null beside tool calls), without skip's call
				case w == '{'|'}'<<8 || w == '['|']'<<8:
					e = v + 2 // an empty container, which the span table does not hold
				}
			}
		}
		if e < 0 {
			// A key the loop has not read (v is 0 then, and e -1: one
			// test for both in the loop's common case).
			if v == 0 {
				if f, v = d.key(b, i, set); v < 0 {
					return -1, plain, other
				}
			}
			// Any other value: a number here, the rest by skip.
			if v = SkipSpace(b, v); v < len(b) && b[v]-'0' <= 9 {
				e = numberEnd(b, v)
			} else if s, ok := d.nextSpan(b[v:]); ok && v+int(s.end-s.start) <= len(b) {
				e = v + int(s.end-s.start) // a long string or a container, without skip's call
			} else if v+1 < len(b) && (b[v] == '{' || b[v] == '[') && b[v+1] == b[v]+2 {
				e = v + 2 // an empty container, which the table does not hold
			} else if e = shortPlain(all, v); e >= 0 && v < len(b) && b[v] == '"' {
				// a short plain string (shortPlain, inlined, is the next
				// branch's e too), without skip's lookups
			} else if e = d.skip(b, v); e < 0 {
				return -1, plain, other
			}
		}
		if f >= len(out) {
			other++
		} else if f >= 0 && (out[f].e == 0 || set.first>>(uint(f)&63)&1 == 0) {
			plain &^= 1 << (uint(f) & 63) // f < len(out) <= 64: no test of the shift
			if short {
				plain |= 1 << (uint(f) & 63)
			}
			out[f] = valueSpan{v, e}
		}
		if i = e + 1; e+1 < len(b) && uint16(b[e])|uint16(b[e+1])<<8 == ','|'"'<<8 {
			continue // the next key right after the comma
		}
		if i = SkipSpace(b, e); i < len(b) && b[i] == ',' {
			i = SkipSpace(b, i+1)
		}
	}
	if i >= len(b) || b[i] != '}' {
		return -1, plain, other
	}
	return i + 1, plain, other
}

// valueSpan is where object found a member's value: b[v:e] of the b it
// read; e is 0 for a member it did not find (a JSON value is never empty).
type valueSpan struct{ v, e int }

// in returns the value s spans in b: empty, not nil, for none (jsonType
// reads it as null).
func (s valueSpan) in(b []byte) []byte { return b[s.v:s.e] }

// plainLen returns how many of the 16 bytes x, y (little endian) need no
// look (see stopASCII), up to the first that does: for the string whose
// quote is followed by those bytes, its length when the byte after them
// is its closing quote. Two word tests and no branch.
func plainLen(x, y uint64) int {
	t := bits.TrailingZeros64(stopASCII(x) & highBits)
	return t>>3 + t>>6*(bits.TrailingZeros64(stopASCII(y)&highBits)>>3)
}

// key is object's reading of the key at b[i] when it is not a short plain
// one with its colon right after it: the key's name in set (by its
// decoded text for the names set.decoded matches so) and where the value
// starts, or -1 (not reached: b is valid JSON).
func (d *jsonDoc) key(b []byte, i int, set *keySet) (f, v int) {
	if all := b[:cap(b)]; i+32 <= len(all) {
		// A key whose first byte to look at is above 0x7f or an
		// escape other than \u ("\né", "x\n", "日\u00e9"): its text
		// holds a byte no name of a set has (see newKeySet), as written
		// and decoded, so it names none, without name's call or the
		// decoding of its escapes; when up to 8 bytes without a quote
		// or a backslash end it, its end is found by one word test,
		// else by shortString (or skip).
		q := i + 1 + plainLen(load64(all, i+1), load64(all, i+9))
		if c := all[q]; c >= 0x80 || c == '\\' && all[q+1] != 'u' {
			k := q + int(c>>7^1)*2
			if k += bits.TrailingZeros64(needsLook(load64(all, k)))>>3 + 1; all[k-1] != '"' {
				if k = shortString(b, i); k < 0 {
					k = d.skip(b, i)
				}
				if k < 0 {
					return -1, -1
				}
			}
			return -1, SkipSpace(b, SkipSpace(b, k)+1) // past ':'
		} else if c == '\\' {
			// A key with a \u escape ("a\u0062"): its end found one word
			// test per escape (past it, needsLook finds the next quote or
			// backslash; a \u escape's hex digits are neither), and only
			// its decoded text can name one of the set (a name holds no
			// backslash), without name's call on the raw bytes, or
			// shortString's and hasBackslash's passes over it.
			// n: the length of its text if every escape is a \u00XX one
			// (the only escape a name's spelling may hold): a key whose n
			// no name decoded matches names none, without decodedName.
			k, n := q, q-i-1
			for k+16 <= len(all) && all[k] == '\\' {
				if k, n = k+2, n+1; all[k-1] == 'u' {
					k += 4
				}
				t := bits.TrailingZeros64(needsLook(load64(all, k))) >> 3
				k, n = k+t, n+t
			}
			if all[k] == '"' {
				if set.decodedLens>>(uint(n)&63)&1 != 0 && uint(n) < 64 {
					f = set.decodedName(b[i+1 : k])
				} else {
					f = -1
				}
				return f, SkipSpace(b, SkipSpace(b, k+1)+1) // past ':'
			}
		}
	}
	k, escaped := shortPlain(b[:cap(b)], i), false
	if k < 0 {
		// A key is never in the table unless it is long: shortString
		// before skip.
		if k = shortString(b, i); k < 0 {
			k = d.skip(b, i)
		}
		if k < 0 {
			return -1, -1
		}
		escaped = set.mayDecode(k-i-2) && hasBackslash(b[i+1:k-1])
	}
	if f = set.name(b[:cap(b)], i+1, k-i-2); f < 0 && escaped {
		f = set.decodedName(b[i+1 : k-1])
	}
	return f, SkipSpace(b, SkipSpace(b, k)+1) // past ':'
}

// decodedName returns the name of s that the escaped key raw (the bytes
// between its quotes) spells once decoded, for the names s matches so, or
// -1. A name holds only ASCII letters and '_' (newKeySet), which only a
// plain byte or a \u00XX escape can spell: the key is decoded one byte or
// one such escape per step into an array on the stack, and any other
// escape or byte ends the search, without the general unescaping (a \u
// escape there costs a call per rune and a write into the doc's buffer:
// a body of unused "a\u0062" keys cost 90 times plain text that way).
func (s *keySet) decodedName(raw []byte) int {
	var buf [keyNameMax + 8]byte // + 8: name reads whole words
	n := 0
	for i := 0; i < len(raw); n++ {
		c := raw[i]
		i++
		if c == '\\' {
			if i+5 > len(raw) || raw[i] != 'u' || raw[i+1] != '0' || raw[i+2] != '0' {
				return -1
			}
			h, _ := unhex(raw[i+3])
			l, _ := unhex(raw[i+4])
			c, i = h<<4|l, i+5
		}
		if !nameByte(c) || n == keyNameMax {
			return -1
		}
		buf[n] = c
	}
	if f := s.name(buf[:], 0, n); f >= 0 && s.decoded>>f&1 != 0 {
		return f
	}
	return -1
}

// lookup puts in v where in obj the values of the first members named by
// set are, as gjson's Get finds them (the first match, by the decoded key),
// and returns which of them are plain (see object); none when obj is not
// an object. Small enough to be inlined: an image part or a tool call
// makes one call, object's, for it.
func (d *jsonDoc) lookup(obj []byte, set *keySet, v []valueSpan) (plain uint64) {
	if len(obj) > 0 && obj[0] == '{' {
		_, plain, _ = d.object(obj, 0, set, v)
	}
	return plain
}

// str is the text of the string value v, which object found plain (a
// short string without escapes: its bytes) or not (text).
func (d *jsonDoc) str(v []byte, plain bool) string {
	if !plain {
		return d.text(v)
	}
	return unsafe.String(&v[1], len(v)-2)
}
