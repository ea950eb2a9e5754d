package openai

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// validJSON reports whether b is one JSON value (RFC 8259) with nothing but
// whitespace around it. It does not check UTF-8 (the caller runs
// utf8.Valid, which is fast everywhere).
//
// Why not gjson.Valid: it walks byte by byte through small functions, and Go
// code compiled to Wasm pays for every call (docs/performance.md). This
// validator is one loop over a table of states with an explicit nesting
// stack (see scanJSONWith), and long strings (nearly all of a prompt) are
// skipped 64 to 128 bytes at a time (see plainRun), which is many times
// faster in Wasm.
func validJSON(b []byte) bool { return scanJSON(b, nil) }

// jsonSpans is what one validating pass learns for the passes after it:
// where each long string and each container ends, and whether a long string
// holds escapes. With it, the walker (jsonwalk.go) steps over a value in
// one lookup instead of rescanning its bytes: the router's parse visits the
// prompt nested three deep (the messages array, a message, its content),
// and without the table each level rescanned it. An object that is an
// element of an array has no entry (the containers and long strings in it
// do): the parser reads messages, content parts and tool calls member by
// member with object, which never needs their end, and an unused array is
// stepped over whole by its own entry; the pass reads such objects without
// leaving its table (see scanJSONWith). The walker's skip still finds the
// end of one by scanning.
type jsonSpans struct {
	spans []jsonSpan // by start, ascending: the order the pass meets them
	stack []uint32   // the pass's open containers (see scanJSONWith)

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
//
// The grammar is one table (jsonStates): the next state for a state and a
// byte's class. The loop that reads it is about the cheapest Go's Wasm
// output has, two lookups per byte, four bytes per loop step and no other
// branch: whitespace, colons, commas, numbers, literals, empty objects and
// arrays, and strings of up to 15 bytes of plain ASCII, escapes and 2-
// and 3-byte characters (keys, roles, small values) never leave it (a \u
// escape's digits are checked in one step out of the table, which then
// reads on: see afterU). A
// state tells the kind of container its value is in, so a comma needs no
// look at the stack. An object that is an element of an array (a message,
// a content part, a tool call) is read by the table from its opening
// brace to its closing one while it holds no non-empty container: its
// states say that its container is an array, so it needs no stack entry,
// and the walker reads such objects member by member and never looks for
// their end in the span table (see jsonSpans). The loop leaves the table
// (an action: actFirst and up) only for a bracket of any other non-empty
// container, which the stack and the span table must see, and for a
// longer string or one the table does not read (\b, a 4-byte character,
// a byte that is not UTF-8 there), which scanString reads from its quote,
// 16 to 128 bytes per step (the state counts the bytes since the quote). A
// value the table reads costs one lookup per byte, where a test and a call
// per value would cost several times that in Wasm, and each bracket that
// leaves it about 30 ns (docs/performance.md, "Body shapes";
// BenchmarkShapeValidate).
func scanJSONWith(b []byte, rec *jsonSpans, stack []uint32) (bool, []uint32) {
	// stack holds, for each open container, the kind of container it is
	// in (the state after it depends on that), and with a table its
	// index in rec.spans times 4.
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
	s, i := row(stValue), 0 // the state before b[i]
	failedAt := -1          // where a string that did not parse ended (badUTF8 for one that is not UTF-8)
scan:
	for {
		// Four bytes per loop step while they stay in the table (each
		// step of a loop is a jump through the function's dispatch in
		// Go's Wasm output), then the last ones one at a time.
		var a uint16
		w := b[i:] // (a view: no bounds check per byte)
		for len(w) >= 4 {
			if a = jsonStates[(int(s)|int(jsonByteClass[w[0]]))&stateMask]; a >= actFirst {
				break
			}
			s = a
			if a = jsonStates[(int(s)|int(jsonByteClass[w[1]]))&stateMask]; a >= actFirst {
				w = w[1:]
				break
			}
			s = a
			if a = jsonStates[(int(s)|int(jsonByteClass[w[2]]))&stateMask]; a >= actFirst {
				w = w[2:]
				break
			}
			s = a
			if a = jsonStates[(int(s)|int(jsonByteClass[w[3]]))&stateMask]; a >= actFirst {
				w = w[3:]
				break
			}
			s = a
			w = w[4:]
		}
		i = len(b) - len(w)
		if i+3 >= len(b) {
			if i >= len(b) {
				break
			}
			if a = jsonStates[(int(s)|int(jsonByteClass[b[i]]))&stateMask]; a < actFirst {
				s, i = a, i+1
				continue
			}
		}
		n := s >> rowBits // the state's number, for the tables by state
		switch a {
		case actString:
			// A \u escape in a short string (a key spelt "a\u0062"): its
			// digits checked here, and the table reads on: leaving it for
			// scanString made a body of such members take twice as long
			// to validate in Wasm. Not when another escape follows (a
			// surrogate pair): that string seldom fits the table, and
			// leaving it twice cost more than scanString's reading it.
			nb := jsonStringBytes[n]
			if w := b[i:]; nb&afterU != 0 && len(w) > 5 && w[0] == 'u' && w[5] != '\\' && hexDigit[w[1]]&hexDigit[w[2]]&hexDigit[w[3]]&hexDigit[w[4]] != 0 {
				s, i = s-row(maxStringBytes-5), i+5 // the plain state 5 bytes on
				continue
			}
			// A string the table does not finish: from its quote, k
			// plain bytes back (the state counts them); after a backslash
			// scanString reads on from it, the table having checked the
			// bytes before ("\ud83d\ude00": the second escape).
			q, from := i, i // a string at the top level: the table leaves at its quote
			if n >= stString {
				q = i - int(nb&^(afterU|afterEscape)) - 1
				if from = q; nb&afterEscape != 0 {
					from = i - 2
				}
			}
			e, escaped := scanString(b, from, nonASCII)
			if e < 0 {
				failedAt = e
				break scan
			}
			// Long values in the table; keys never (the walker scans them).
			if s = jsonAfterString[n]; rec != nil && e-q >= minSpanString && s != row(stColon) && s != row(stInColon) {
				if len(rec.spans) == cap(rec.spans) {
					rec.grow()
				}
				rec.add(jsonSpan{start: int32(q), end: int32(e), escaped: escaped})
			}
			i = e
		case actOpen:
			// The bracket is the byte before: b[i] is the first of the
			// container's body, read again from the state after the
			// bracket.
			i--
			c, in := b[i], int(jsonInOf[n])
			if rec != nil && len(rec.spans) == cap(rec.spans) {
				rec.grow() // room for the span this value may add
			}
			// An array of plain integers (a token-id prompt, or one of
			// its batches) or of strings in one call, without a stack
			// entry; in the table only when long, as strings are.
			if c == '[' && i+1 < len(b) && (b[i+1]-'0' <= 9 || b[i+1] == '[') { // a chat body never enters it
				if e := intArrays(b, i, rec); e > 0 {
					s, i = jsonAfter[in], e
					continue
				}
			}
			// Strings by stringArray only at the top level or in a
			// member of it (where a prompt is): deeper, an array is
			// short (a tool schema's "enum", "required"), and its call
			// cost more than the stack entry and the table's reading
			// it (tool schemas validated 22% faster in Wasm without).
			if c == '[' && i+1 < len(b) && b[i+1] == '"' && rec != nil && len(stack) < 2 {
				if e := stringArray(b, i, rec, nonASCII); e > 0 {
					s, i = jsonAfter[in], e
					continue
				}
			}
			// The stack entry. A container in an object in an array
			// has inArrayObject: the object, which has no entry, is
			// read on by the table's states after it.
			top := uint32(in)
			if rec != nil {
				top |= uint32(rec.add(jsonSpan{start: int32(i), end: -1})) << 2
			}
			stack = append(stack, top)
			if s = row(stValueOrClose); c == '{' {
				s = row(stKeyOrClose)
			}
			i++
		case actClose, actCloseEmpty:
			top := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if rec != nil {
				if a == actClose {
					rec.spans[top>>2].end = int32(i + 1)
				} else {
					rec.spans = rec.spans[:top>>2] // an empty container, which the table does not hold (its entry is the last)
				}
			}
			s = jsonAfter[top&3]
			i++
		default: // a byte the grammar does not allow there
			break scan
		}
	}
	if i >= len(b) {
		return len(stack) == 0 && (s == row(stAfterTop) || jsonNumberEnds[s>>rowBits]), stack
	}
	// Every failure breaks out to here: one return, and one test for a
	// string that is not UTF-8 (in Wasm each copy is code of a function
	// every request enters). Only scanString ends at badUTF8.
	if failedAt == badUTF8 {
		rec.badUTF8 = true
	}
	return false, stack
}

// The kinds of container a value may be in: the top level (none), an
// object, an array, and an object in an array (whose states close it in
// the table, see scanJSONWith).
const inTop, inObject, inArray, inArrayObject = 0, 1, 2, 3

// The states of jsonStates. A value's states come in four sets, one per
// kind of container it is in, so that what may follow it (a comma and
// what then, which bracket) is the state's to say: the set of in is at
// offset in*inStride among the numbers' and literals' states, and the
// string states are laid out the same way.
const (
	stValue        = iota // the document's value
	stAfterTop            // after it: only whitespace
	stKeyOrClose          // after '{'
	stKey                 // after ',' in an object
	stColon               // after a key
	stValueObject         // after ':'
	stAfterObject         // after a member's value
	stValueOrClose        // after '['
	stValueArray          // after ',' in an array
	stAfterArray          // after an element
	// The same for an object in an array (inArrayObject).
	stInKeyOrClose // after '{'
	stInKey        // after ','
	stInColon      // after a key
	stInValue      // after ':'
	stInAfter      // after a member's value

	// A number's states, numbers + in*inStride + one of these.
	numMinus, numZero, numInt, numDot, numFrac, numE, numSign, numExp = 0, 1, 2, 3, 4, 5, 6, 7
	stNumber                                                          = 16
	// A literal's states after its first bytes: t, tr, tru, f, fa, fal,
	// fals, n, nu, nul.
	stLiteral = stNumber + 8
	inStride  = 18 // from one container kind's number and literal states to the next's

	// A string's states, stString + kind*stringKind + sub*maxStringBytes
	// + the bytes read since the quote (0 to maxStringBytes-1). kind is
	// one of strKinds (a string that is the whole document is read by
	// scanString); sub is where the string is: in plain text (strPlain),
	// after a backslash (strEscape), or inside a UTF-8 character with one
	// or two bytes to come (strCont1, strCont2).
	stString                                = stNumber + 4*inStride
	maxStringBytes                          = 16
	strPlain, strEscape, strCont1, strCont2 = 0, 1, 2, 3
	stringKind                              = 4 * maxStringBytes
	// After an opening bracket ({ or [, one state of each per kind of
	// container the value is in, stOpen + 4*bracket + in): the next byte
	// closes it (an empty container, which needs neither the stack nor
	// the span table) or leaves the table to open it (actOpen, the
	// bracket one byte back). An object in an array has none: its states
	// read it.
	stOpen         = stString + len(strKinds)*stringKind
	jsonStateCount = stOpen + 8

	// A state is held as its row's offset in jsonStates (its number
	// shifted by rowBits), so that a lookup is an OR with the byte's
	// class; stateMask bounds the index without a bounds check.
	rowBits   = 5
	stateMask = 1<<14 - 1

	// Actions: what the loop leaves the table for (every entry from
	// actFirst up), with the state it leaves from.
	actFirst      = 0xfff0
	actString     = 0xfff0 // a string the table does not finish
	actOpen       = 0xfff1 // '{' or '['
	actClose      = 0xfff2 // '}' or ']' after a value
	actCloseEmpty = 0xfff3 // '}' or ']' after its opener and whitespace
	actFail       = 0xffff
)

// afterEscape marks, in jsonStringBytes, a string state after a
// backslash, and afterU one whose string still fits the table with a \u
// escape's 'u' and four hex digits more: scanJSONWith checks those and
// goes on in the plain state 5 bytes on. (Bits of an existing table: a
// table of its own moved other body shapes' costs by up to a quarter in
// Wasm, with where it fell.)
const afterEscape, afterU = 0x40, 0x80

// strKinds are the kinds of string states by where the string is: the
// state after its closing quote, and the kind of container it is in.
var strKinds = [...]struct{ end, in int }{
	{stColon, inObject},        // a key
	{stAfterObject, inObject},  // a member's value
	{stAfterArray, inArray},    // an element
	{stInColon, inArrayObject}, // a key of an object in an array
	{stInAfter, inArrayObject}, // a member's value there
}

// row is the state st as the loop holds it (see rowBits).
func row(st int) uint16 { return uint16(st << rowBits) }

// jsonAfter is the state after a value in a container of kind in (the
// low bits of a stack entry).
var jsonAfter = [4]uint16{row(stAfterTop), row(stAfterObject), row(stAfterArray), row(stInAfter)}

// jsonStates is the grammar of JSON as a table of states: entry
// s|jsonByteClass[c] is the state after byte c in state s (a row offset:
// see rowBits), or an action (actFirst and up). It is built byte by byte
// and then folded by class. By state number: jsonInOf is the container
// kind of each state's value, jsonStringBytes the bytes a string state
// has read since its quote, jsonAfterString the state after the string a
// state is in (or that starts at the top level), and jsonNumberEnds marks
// the states of a top-level number that may end the document.
var jsonStates, jsonInOf, jsonStringBytes, jsonAfterString, jsonNumberEnds = func() (classed [stateMask + 1]uint16, in, strBytes [1 << (16 - rowBits)]uint8, afterStr [1 << (16 - rowBits)]uint16, ends [1 << (16 - rowBits)]bool) {
	t := new([jsonStateCount * 256]uint16)
	for k := range t {
		t[k] = actFail
	}
	row := func(s int) []uint16 { return t[s<<8 : s<<8+256] }
	const space = " \t\n\r"
	for st := stValue; st <= stInAfter; st++ {
		for _, c := range space {
			row(st)[c] = uint16(st)
		}
	}
	values := []int{stValue, stValueObject, stValueArray, stInValue}
	afters := []int{stAfterTop, stAfterObject, stAfterArray, stInAfter}
	strOf := []int{-1, 1, 2, 4} // the string kind (strKinds) of a value in each kind of container
	// What may follow a value in each kind of container.
	follow := func(r []uint16, kind int) {
		for _, c := range space {
			r[c] = uint16(afters[kind])
		}
		switch kind {
		case inObject:
			r[','], r['}'] = stKey, actClose
		case inArray:
			r[','], r[']'] = stValueArray, actClose
		case inArrayObject:
			r[','], r['}'] = stInKey, stAfterArray // closed in the table
		}
	}
	for kind := inTop; kind <= inArrayObject; kind++ {
		follow(row(afters[kind]), kind)
		num := stNumber + kind*inStride
		lit := stLiteral + kind*inStride
		starts := []int{values[kind]}
		if kind == inArray {
			starts = append(starts, stValueOrClose)
		}
		for _, st := range starts {
			in[st] = uint8(kind)
			r := row(st)
			r['{'], r['['] = uint16(stOpen+kind), uint16(stOpen+4+kind)
			if kind == inArray {
				r['{'] = stInKeyOrClose
			}
			r['"'] = actString
			if kind != inTop {
				r['"'] = uint16(stString + strOf[kind]*stringKind)
			}
			r['-'], r['0'] = uint16(num+numMinus), uint16(num+numZero)
			for c := '1'; c <= '9'; c++ {
				r[c] = uint16(num + numInt)
			}
			r['t'], r['f'], r['n'] = uint16(lit), uint16(lit+3), uint16(lit+7)
		}
		// Numbers: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
		for c := '0'; c <= '9'; c++ {
			row(num + numMinus)[c] = uint16(num + numInt)
			row(num + numInt)[c] = uint16(num + numInt)
			row(num + numDot)[c] = uint16(num + numFrac)
			row(num + numFrac)[c] = uint16(num + numFrac)
			row(num + numE)[c] = uint16(num + numExp)
			row(num + numSign)[c] = uint16(num + numExp)
			row(num + numExp)[c] = uint16(num + numExp)
		}
		row(num + numMinus)['0'] = uint16(num + numZero)
		for _, st := range []int{numZero, numInt} {
			row(num + st)['.'] = uint16(num + numDot)
		}
		for _, st := range []int{numZero, numInt, numFrac} {
			row(num + st)['e'], row(num + st)['E'] = uint16(num+numE), uint16(num+numE)
		}
		row(num + numE)['+'], row(num + numE)['-'] = uint16(num+numSign), uint16(num+numSign)
		for _, st := range []int{numZero, numInt, numFrac, numExp} {
			follow(row(num+st), kind)
			if kind == inTop {
				ends[num+st] = true
			}
		}
		// Literals: true, false, null.
		for k, w := range []string{"rue", "alse", "ull"} {
			first := lit + []int{0, 3, 7}[k]
			for j := 0; j < len(w); j++ {
				next := first + j + 1
				if j == len(w)-1 {
					next = afters[kind]
				}
				row(first + j)[w[j]] = uint16(next)
			}
		}
		for st := num; st < lit+10; st++ {
			in[st] = uint8(kind)
		}
		// After an opening bracket of a value in this kind of container.
		for k, closer := range []byte{'}', ']'} {
			st := stOpen + 4*k + kind
			in[st] = uint8(kind)
			for c := 0; c < 0x100; c++ {
				row(st)[c] = actOpen
			}
			row(st)[closer] = uint16(afters[kind])
		}
	}
	afterStr[stValue] = stAfterTop
	// Object keys and brackets.
	for _, st := range []int{stKeyOrClose, stKey} {
		row(st)['"'] = stString
		in[st] = inObject
	}
	for _, st := range []int{stInKeyOrClose, stInKey} {
		row(st)['"'] = stString + 3*stringKind
		in[st] = inArrayObject
	}
	row(stKeyOrClose)['}'] = actCloseEmpty
	row(stInKeyOrClose)['}'] = stAfterArray
	row(stValueOrClose)[']'] = actCloseEmpty
	row(stColon)[':'] = stValueObject
	row(stInColon)[':'] = stInValue
	in[stAfterObject], in[stAfterArray], in[stInAfter] = inObject, inArray, inArrayObject
	// Strings: up to maxStringBytes-1 bytes of plain ASCII, simple
	// escapes other than \b and 2- and 3-byte UTF-8 characters without
	// the lead bytes that restrict what follows (E0, ED) in the table; the
	// rest, and any string in doubt (a 4-byte character, a byte that is
	// not UTF-8 there), by scanString from the quote, which also decides
	// what it accepts. A \u escape leaves the table at its 'u', and
	// scanJSONWith checks its digits and reads on (afterU) while the
	// string fits the table.
	for kind, sk := range strKinds {
		state := func(sub, k int) int { return stString + kind*stringKind + sub*maxStringBytes + k }
		// next is the state sub with one byte more than k, or the
		// action when the table holds no more.
		next := func(sub, k int) uint16 {
			if k+1 >= maxStringBytes {
				return actString
			}
			return uint16(state(sub, k+1))
		}
		for sub := strPlain; sub <= strCont2; sub++ {
			for k := 0; k < maxStringBytes; k++ {
				st := state(sub, k)
				in[st], strBytes[st], afterStr[st] = uint8(sk.in), uint8(k), uint16(sk.end)
				if sub == strEscape {
					strBytes[st] |= afterEscape
					if k+5 < maxStringBytes {
						strBytes[st] |= afterU
					}
				}
				r := row(st)
				for c := 0; c < 0x100; c++ {
					r[c] = actString
				}
				switch sub {
				case strPlain:
					for c := 0x20; c < 0x80; c++ {
						r[c] = next(strPlain, k)
					}
					for c := 0; c < 0x20; c++ {
						r[c] = actFail
					}
					r['\\'], r['"'] = next(strEscape, k), uint16(sk.end)
					for c := 0xc2; c <= 0xdf; c++ {
						r[c] = next(strCont1, k)
					}
					for c := 0xe1; c <= 0xef; c++ {
						if c != 0xed {
							r[c] = next(strCont2, k)
						}
					}
				case strEscape:
					for _, c := range `"\\/fnrt` {
						r[c] = next(strPlain, k)
					}
				case strCont1, strCont2:
					after := strPlain // the character's last byte
					if sub == strCont2 {
						after = strCont1
					}
					for c := 0x80; c <= 0xbf; c++ {
						r[c] = next(after, k)
					}
				}
			}
		}
	}
	for st := range afterStr {
		afterStr[st] <<= rowBits
	}
	// The same table by byte class, states as row offsets: every byte of
	// a class must move every state alike.
	for c := 0; c < 256; c++ {
		for st := 0; st < jsonStateCount; st++ {
			k := st<<rowBits | int(jsonByteClass[c])
			v := t[st<<8|c]
			if v < actFirst {
				v <<= rowBits
			}
			if c != int(jsonClassByte[jsonByteClass[c]]) && classed[k] != v {
				panic("openai: byte classes of the JSON grammar do not agree")
			}
			classed[k] = v
		}
	}
	return classed, in, strBytes, afterStr, ends
}()

// jsonByteClass is the class of each byte in jsonStates: the bytes one
// class holds move every state alike, so the table has 32 columns, not
// 256 (a table of 136 states by 256 bytes, 34 KiB, made the body shapes'
// costs move by a fifth with where it fell among the parser's buffers).
// jsonClassByte is the first byte of each class.
var jsonByteClass, jsonClassByte = func() (cls [256]uint8, first [32]uint8) {
	n := uint8(1) // class 0: printable ASCII the grammar gives no role outside strings
	add := func(set []byte) {
		for _, c := range set {
			cls[c] = n
		}
		first[n] = set[0]
		n++
	}
	for _, set := range []string{" ", "\t\n\r", "\"", "\\", "/", "{", "}", "[", "]", ":", ",", "-", "+", ".", "0", "123456789",
		"e", "E", "t", "r", "u", "f", "a", "l", "s", "n"} {
		add([]byte(set))
	}
	// Control characters, and bytes above 0x7f: UTF-8 continuation
	// bytes, leads of 2-byte characters, leads of 3-byte characters
	// whose second byte may be any continuation byte, and the rest.
	var ctrl, cont, lead2, lead3, high []byte
	for c := 0; c < 0x100; c++ {
		switch {
		case c < 0x20 && cls[c] == 0:
			ctrl = append(ctrl, byte(c))
		case c >= 0x80 && c <= 0xbf:
			cont = append(cont, byte(c))
		case c >= 0xc2 && c <= 0xdf:
			lead2 = append(lead2, byte(c))
		case c >= 0xe1 && c <= 0xef && c != 0xed:
			lead3 = append(lead3, byte(c))
		case c >= 0x80:
			high = append(high, byte(c))
		}
	}
	for _, set := range [][]byte{ctrl, cont, lead2, lead3, high} {
		add(set)
	}
	first[0] = '!'
	return cls, first
}()

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
// holds nothing but plain integers (no sign, fraction, exponent or leading
// zero: 0 is token id 0), or nothing but non-empty arrays of them, as
// token-id prompts and their batches are sent; and -1 for any
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
	if n < len(ids) {
		// The ids followed by a comma (or, in a batch, by "],[" and the
		// next batch's first id) in one call; the loop below reads the
		// rest, from the byte before the first id idRun did not read.
		if nested {
			i, n = idBatchRun(b, i+1, ids, n)
		} else {
			i, n = idRun(b, i+1, ids, n)
		}
		i, n = spacedIDRun(b, i, ids, n, nested)
		i--
	}
arrays:
	for {
		// An array of integers from b[i] ('['): a digit starts each
		// (0 alone), and a comma or the closing bracket follows it,
		// whitespace allowed around them (Python's json.dumps writes
		// ", "). An empty batch is valid JSON but no token ids.
		closed, comma := false, b[i] == ',' // (a comma idBatchRun read)
		if i = SkipSpace(b, i+1); nested && i < len(b) && b[i] == ']' {
			if comma { // then the batch's end: no empty batch
				i = -1
				break arrays
			}
			closed, tokens = true, false
		}
		for ; !closed && i < len(b) && b[i]-'0' <= 9; i = SkipSpace(b, i+1) {
			v, digits, zero := uint64(b[i]-'0'), 1, b[i] == '0'
			for i++; i < len(b) && b[i]-'0' <= 9; i++ {
				v, digits = v*10+uint64(b[i]-'0'), digits+1
			}
			if zero && digits > 1 {
				break // a leading zero: not JSON
			}
			if digits > 10 || v > maxTokenID {
				tokens = false
			}
			if n < len(ids) {
				ids[n] = uint32(v)
				n++
			}
			if i = SkipSpace(b, i); i < len(b) && b[i] == ']' {
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
		if i = SkipSpace(b, i); i < len(b) && b[i] == ',' {
			if i = SkipSpace(b, i+1); i < len(b) && b[i] == '[' {
				continue
			}
			i = -1
			break arrays
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

// idRun reads, from b[i], the token ids that are followed by a comma
// within 8 bytes of their first digit (1 to 7 digits, none a leading
// zero) into ids[n:], and returns the index of the first byte it did not
// read and the new n. Word arithmetic per id (digitsWord), where reading
// a digit at a time cost a loop step per digit: a token id is 1 to 6
// digits. Not inlined into intArrays, whose loop it would slow (more
// values live at once than Go's Wasm output keeps in locals).
//
//go:noinline
func idRun(b []byte, i int, ids []uint32, n int) (int, int) {
	for i >= 0 && i+8 <= len(b) && n < len(ids) && b[i]-'0' <= 9 {
		if b[i+1] == ',' { // one digit: no arithmetic
			ids[n] = uint32(b[i] - '0')
			i, n = i+2, n+1
			continue
		}
		v, k := digitsWord(load64(b, i))
		if k == 0 || b[i+k] != ',' || b[i] == '0' { // (a leading zero is not JSON)
			break
		}
		ids[n] = uint32(v)
		i, n = i+k+1, n+1
	}
	return i, n
}

// idBatchRun is idRun for a batch of prompts ([[7,8],[9,10],...]): it
// also reads an id that ends a batch when "],[" and the next batch's
// first id follow. Apart from idRun, whose loop for a flat prompt was 7 %
// slower with this test in it.
//
//go:noinline
func idBatchRun(b []byte, i int, ids []uint32, n int) (int, int) {
	for i >= 0 && i+12 <= len(b) && n < len(ids) {
		// A view of the 12 bytes an id and what follows it can take
		// (7 digits and "],[" and a digit): one bounds test per id, not
		// one per byte looked at.
		w := b[i : i+12 : i+12]
		if w[0]-'0' > 9 {
			break
		}
		v, k := uint64(w[0]-'0'), 1 // one digit: no arithmetic
		if w[1]-'0' <= 9 {
			if v, k = digitsWord(load64(w, 0)); k == 0 || w[0] == '0' { // (a leading zero is not JSON)
				break
			}
		}
		k &= 7 // as it is (digitsWord): so that w's indices below need no test
		if w[k] == ',' {
			i += k + 1
		} else if binary.LittleEndian.Uint32(w[k:])&0xffffff == ']'|','<<8|'['<<16 && w[k+3]-'0' <= 9 {
			i += k + 3 // the next batch, not empty
		} else {
			break
		}
		ids[n] = uint32(v)
		n++
	}
	return i, n
}

// spacedIDRun goes on from where idRun or idBatchRun stopped, at b[i],
// when that is the space of ", " after an id: the ids spaced as Python's
// json.dumps writes them (", " between ids and, nested, "], [" between
// batches). Those loops stop at the first space; with this one's tests in
// them they cost compact prompts up to 20% more in Wasm, so spaced ids
// have a loop of their own, entered once per array. It is entered only
// when an id follows the space, and takes an id only when the separator
// after it is followed by the next id: a run ends where the general loop
// of intArrays must look, so that loop still sees the comma of ", ]"
// (not JSON) where it would otherwise take "]" for a batch's end.
//
//go:noinline
func spacedIDRun(b []byte, i int, ids []uint32, n int, nested bool) (int, int) {
	if i < 1 || i+1 >= len(b) || b[i] != ' ' || b[i-1] != ',' || b[i+1]-'0' > 9 {
		return i, n
	}
	for i++; i+12 <= len(b) && n < len(ids); {
		w := b[i : i+12 : i+12] // an id of up to 7 digits, "], [" and a digit: see idBatchRun
		if w[0]-'0' > 9 {
			break
		}
		v, k := uint64(w[0]-'0'), 1
		if w[1]-'0' <= 9 {
			if v, k = digitsWord(load64(w, 0)); k == 0 || w[0] == '0' { // (a leading zero is not JSON)
				break
			}
		}
		k &= 7 // as it is: see idBatchRun
		if w[k] == ',' && w[k+1] == ' ' && w[k+2]-'0' <= 9 {
			i += k + 2
		} else if nested && binary.LittleEndian.Uint32(w[k:]) == ']'|','<<8|' '<<16|'['<<24 && w[k+4]-'0' <= 9 {
			i += k + 4
		} else {
			break
		}
		ids[n] = uint32(v)
		n++
	}
	return i, n
}

// digitsWord reads the decimal digits that x (8 bytes of a body, the
// first a digit) starts with when a byte that is not a digit ends them
// within the word: their value and count (1 to 7), with word arithmetic
// and no loop; and 0, 0 when all eight bytes are digits.
func digitsWord(x uint64) (v uint64, n int) {
	const ones = 0x0101010101010101
	// y holds each digit's value up to the first byte that is not one
	// (a borrow from that byte may change only the bytes above it), and
	// that byte's high bit is set in nd: its y is above 9.
	y := x - '0'*ones
	nd := ((y&^highBits + 0x76*ones) | y) & highBits
	n = bits.TrailingZeros64(nd) >> 3
	if n == 8 {
		return 0, 0
	}
	// The digits moved to the top of the word, zeros before them: the
	// eight-digit reading of simdjson (parse_eight_digits_unrolled).
	z := y << (64 - 8*uint(n))
	z = z * (10<<8 + 1) >> 8
	z = (z & 0x00ff00ff00ff00ff) * (100<<16 + 1) >> 16
	z = (z & 0x0000ffff0000ffff) * (10000<<32 + 1) >> 32
	return z, n
}

// stringArray is intArrays for an array of strings separated by commas,
// without spaces or with the one json.dumps writes after each (a prompt
// sent as strings), with the table rec: it returns
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
		e := -1
		if i+16 <= len(b) {
			// A string that closes within the 9 bytes after its quote,
			// plain or with one simple escape just before its closing
			// quote ("\n", "ab\t"), copied as one word and the escaped
			// byte written over its place: one word test and no call,
			// and with the comma and the next quote after it, the next
			// step. Each such string cost a call to shortEscaped, most of
			// a batch of escaped strings' validation in Wasm. w is a
			// view of 16 bytes, so that no index in it needs a bounds
			// test of its own (j is at most 9).
			w := b[i : i+16 : i+16]
			j := 1 + bits.TrailingZeros64(stopASCII(load64(w, 1))&highBits)>>3 // as in shortPlain
			if w[j] >= utf8.RuneSelf {
				// Text other than ASCII ("é", "日本"): its closing quote,
				// or the backslash of an escape just before it ("éé\t"),
				// found by needsLook, which passes such bytes, and the
				// text before it checked by word tests (shortUTF8), else
				// by utf8.Valid, where scanString and mixedRun per string,
				// and appendUnescaped for an escaped one, cost several
				// times more in Wasm. A backslash not so placed is taken
				// no further here: the general way below reads it.
				if k := 1 + bits.TrailingZeros64(needsLook(load64(w, 1)))>>3; (w[k] == '"' || w[k] == '\\') && (nonASCII == 0 || shortUTF8(load64(w, 1), k-1) || utf8.Valid(w[1:k])) {
					j = k
				}
			}
			binary.LittleEndian.PutUint64(text[n:], load64(w, 1))
			if c := w[j]; c == '"' {
				if n += j - 1; w[j+1] == ',' && w[j+2] == '"' {
					i += j + 2
					continue
				}
				e = i + j + 1
			} else if u := unescapedByte[w[j+1]]; c == '\\' && u != 0 && w[j+2] == '"' {
				text[n+j-1] = u
				if n += j; w[j+3] == ',' && w[j+4] == '"' {
					i += j + 4
					continue
				}
				e = i + j + 3
			}
		}
		if e < 0 {
			if se, sn := shortEscaped(b, i, text, n); se >= 0 {
				e, n = se, sn
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
		}
		// A comma and the next string (also after the space json.dumps
		// writes, or any whitespace), or the end of the array.
		if e+1 < len(b) && b[e] == ',' && b[e+1] == '"' {
			i = e + 1
			continue
		}
		if e+2 < len(b) && b[e] == ',' && b[e+1] == ' ' && b[e+2] == '"' {
			i = e + 2
			continue
		}
		if e+1 < len(b) && b[e] == ',' && jsonSpace[b[e+1]] {
			if k := quoteAfterSpace(b, e+1); k > 0 {
				i = k
				continue
			}
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

// quoteAfterSpace returns the index of the quote that the whitespace from
// b[i] runs up to, or -1 when something else ends it: stringArray's next
// string after whitespace other than json.dumps's one space. Not inlined:
// rare, and SkipSpace's loop inside stringArray's made batches spaced as
// json.dumps writes them 25% slower in Wasm.
//
//go:noinline
func quoteAfterSpace(b []byte, i int) int {
	if i = SkipSpace(b, i); i < len(b) && b[i] == '"' {
		return i
	}
	return -1
}

// shortUTF8 reports whether the n bytes (1 to 8) x starts with (the
// bytes past them may be anything) are 2-byte UTF-8 characters only
// (Latin with accents, Cyrillic, Greek...): the word test of validRun on
// x with the bytes past n filled with such characters. False for any
// other text, which the caller then gives to utf8.Valid. Inlined: a call
// per string cost stringArray a fifth of a batch of "é".
func shortUTF8(x uint64, n int) bool {
	const ones16 = 0x0001000100010001
	mask := ^uint64(0) >> ((64 - 8*uint(n)) & 63)
	y := x&mask | 0xa9c3a9c3a9c3a9c3&^mask // "é" past n
	v := y & 0x001e001e001e001e            // no lead C0 or C1 (overlong)
	return n&1 == 0 && y&0xc0e0c0e0c0e0c0e0 == 0x80c080c080c080c0 && (v-ones16)&^v&0x8000800080008000 == 0
}

// shortEscaped returns the index after the string starting at b[i] (a
// quote) when it closes within 16 bytes and holds only ASCII, 2- and
// 3-byte UTF-8 characters and escapes (\u ones but surrogates), with its
// text written to text[n:] and n moved past it; or -1 and n for any other
// string (stringArray then scans it in full). A prompt of short escaped
// strings ("\n", "é\né", "\"é日", "\u00e9") cost a scan and an unescaping
// call per string, and with characters other than ASCII in them, mixedRun's
// utf8.DecodeRune too: up to 60 times plain text in Wasm.
func shortEscaped(b []byte, i int, text []byte, n int) (int, int) {
	m := n
	for k := i + 1; k < len(b) && k <= i+16 && m < len(text); {
		switch c := b[k]; {
		case c == '"':
			return k + 1, m
		case c == '\\':
			if k+1 >= len(b) {
				return -1, n
			}
			if u := unescapedByte[b[k+1]]; u != 0 {
				text[m] = u
				m, k = m+1, k+2
				continue
			}
			// \u and four hex digits, written as appendUnescaped writes
			// them; a surrogate (one of a pair, or alone) the general way.
			if b[k+1] != 'u' || k+6 > len(b) || !isHex4(b[k+2:]) || m+utf8.UTFMax > len(text) {
				return -1, n
			}
			r := rune(hex4(b, k+2))
			if utf16.IsSurrogate(r) {
				return -1, n
			}
			m, k = m+utf8.EncodeRune(text[m:], r), k+6
		case c >= 0xc2 && c < 0xe0 && k+1 < len(b) && b[k+1]&0xc0 == 0x80 && m+1 < len(text):
			// A 2-byte character (C0 and C1 lead only overlong ones).
			text[m], text[m+1] = c, b[k+1]
			m, k = m+2, k+2
		case c >= 0xe0 && c < 0xf0 && k+2 < len(b) && b[k+1]&0xc0 == 0x80 && b[k+2]&0xc0 == 0x80 && m+2 < len(text) &&
			(c != 0xe0 || b[k+1] >= 0xa0) && (c != 0xed || b[k+1] < 0xa0):
			// A 3-byte character (after E0 the second byte is A0 to BF,
			// else the character is overlong; after ED, 80 to 9F, else it
			// is a surrogate).
			text[m], text[m+1], text[m+2] = c, b[k+1], b[k+2]
			m, k = m+3, k+3
		case c < 0x20 || c >= utf8.RuneSelf:
			return -1, n
		default:
			text[m] = c
			m, k = m+1, k+1
		}
	}
	return -1, n
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

// plainStringByte marks bytes a string may hold as they are: everything but
// the quote, the backslash and control characters.
var plainStringByte = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// simpleEscape is 1 for the bytes that may follow a backslash other than
// 'u', 0 for every other byte (a table: in Wasm a switch on them would be
// ~110 instructions of scanString; bytes, so that four lookups can be
// ANDed without a branch each).
var simpleEscape = [256]uint8{'"': 1, '\\': 1, '/': 1, 'b': 1, 'f': 1, 'n': 1, 'r': 1, 't': 1}

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
		// Text up to the next escape or the quote, escapes one after
		// another, and the closing quote, without leaving this loop: a
		// step per 16 bytes of text and per escape, a \u escape by one
		// word test (the first thing tested: json.dumps writes every
		// character other than ASCII so by default), four simple escapes
		// ("\n\n...") per word. A string is mostly keys and short values,
		// lines ending in \n, or such escapes; a search, a switch and a
		// loop step per escape cost such text three times as much to
		// validate in Wasm. Text that goes on for 32 bytes is left to the
		// long steps of plainRun; anything else (a byte to check or
		// refuse, an escape that is not one, the last 24 bytes of b) to
		// the switch below. A word from up to 15 bytes on is in b.
		plain := 0
		for i >= 0 && i+24 <= len(b) && plain < 2 {
			x := load64(b, i)
			if uint16(x) == '\\'|'u'<<8 && hex4Word(uint32(x>>16)) {
				i, plain, escaped = i+6, 0, true
				continue
			}
			m := needsLook(x) | x&nonASCII
			if m == 0 {
				if x = load64(b, i+8); needsLook(x)|x&nonASCII == 0 {
					i, plain = i+16, plain+1
					continue
				}
				i, m = i+8, needsLook(x)|x&nonASCII
			}
			if k := bits.TrailingZeros64(m) >> 3; k != 0 {
				i += k
				x = load64(b, i)
			}
			if uint16(x) == '\\'|'u'<<8 {
				if !hex4Word(uint32(x >> 16)) {
					break
				}
				i, plain, escaped = i+6, 0, true
				continue
			}
			if byte(x) == '\\' && simpleEscape[byte(x>>8)] != 0 {
				// When another follows ("\n\n..."), four per word while a
				// word holds four (a backslash in every even byte, an
				// escape's letter in every odd one).
				i, plain, escaped = i+2, 0, true
				if byte(x>>16) == '\\' {
					for ; i >= 0 && i+8 <= len(b); i += 8 {
						y := load64(b, i)
						if y&0x00ff00ff00ff00ff != 0x005c005c005c005c ||
							simpleEscape[byte(y>>8)]&simpleEscape[byte(y>>24)]&simpleEscape[byte(y>>40)]&simpleEscape[byte(y>>56)] == 0 {
							break
						}
					}
				}
				continue
			}
			if byte(x) == '"' {
				return i + 1, escaped
			}
			break
		}
		if plain >= 2 {
			if nonASCII != 0 {
				i = plainRunASCII(b, i)
			} else {
				i = plainRun(b, i, 0)
			}
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
			case simpleEscape[c] != 0:
				i += 2
			case c == 'u' && isHex4(b[i+2:]):
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
			// exactly when its characters are. A lone character of 2 or
			// 3 bytes before an ASCII byte (a key or a short value:
			// "日\u00e9", "é\n") by one word test instead, without
			// mixedRun's call and its utf8.DecodeRune.
			if i >= 0 && i+8 <= len(b) {
				x := load64(b, i)
				if x&0x80c0e0 == 0x0080c0 && c >= 0xc2 { // 2 bytes (C0, C1: overlong), then ASCII
					i += 2
					continue
				}
				if x&0x80c0c0f0 == 0x008080e0 && c != 0xe0 && c != 0xed { // 3 bytes (E0, ED restrict the second), then ASCII
					i += 3
					continue
				}
			}
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

// hex4Word reports whether the four bytes of x are hex digits, by word
// arithmetic: cheaper in Wasm than isHex4's four lookups (a run of \u
// escapes validated 15% faster). A byte's high bit is set in d where it is
// '0' to '9', in a where, with bit 5 set (lower case), it is 'a' to 'f';
// each byte adds without carrying into the next while below 0x80, and a
// byte above fails by the last mask (whatever its carry did above it).
func hex4Word(x uint32) bool {
	const ones = 0x01010101
	d := (x + (0x80-'0')*ones) &^ (x + (0x80-'9'-1)*ones)
	l := x | 0x20*ones
	a := (l + (0x80-'a')*ones) &^ (l + (0x80-'f'-1)*ones)
	return (d|a)&^x&0x80808080 == 0x80808080
}
