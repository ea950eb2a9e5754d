package openai

import (
	"math"
	"math/bits"
)

// The read budget: how much of a body's JSON the parser reads in full.
//
// Reading a value costs the parser about a byte's worth per byte of a
// long string, and tens of times that per byte of small objects, short
// strings and brackets (docs/performance.md, "Body shapes"). So that no
// body costs much more than plain text of its size, a first pass
// (trimmer.trim) reads the body's structure alone, eight bytes a step
// (structureEnd), and gives the parser a view of it in which:
//
//   - an array is read up to the element during which the bytes of
//     structure read so far (strings count as at most 32 bytes each) pass
//     readBudget, and at least its first element: the elements after it
//     are left out. A prompt longer than that (a conversation of a
//     thousand small messages, tens of thousands of token ids) is hashed,
//     matched and recorded for its first part only, as routers cap the
//     blocks they match; the engine still gets the whole body;
//   - a top-level member the parser does not read (any key other than
//     requestFields', as written or decoded) has its container value left
//     out (read as 0): kvroute neither reads nor checks what it does not
//     route by, and the engine's JSON parser checks it;
//   - an object is never shortened: a body whose objects alone hold more
//     than twice readBudget of structure is refused, as is one with more
//     than maxMembers top-level members or nested deeper than maxNesting
//     (Python's json module, which vLLM and SGLang parse requests with,
//     refuses nesting past about a thousand levels).
//
// What is left out is not validated by kvroute: a body that is not JSON
// there gets the engine's 400 rather than kvroute's. Its structure is read
// as any JSON parser reads it (quotes, escapes and brackets), so a body a
// parser accepts has the same top-level members in the view, and
// client-only members are still found and removed (dropClientOnly).
//
// Scope: one request. The trimmer's buffers are the parser's, one per
// worker.
const (
	readBudget  = 64 << 10
	maxMembers  = 4096
	maxNesting  = 512
	stringCost  = 32 // what a string counts for
	bracketCost = 16 // a bracket
	numberCost  = 2  // a number or literal in an array
	viewSlack   = 64 // room after the view for the walker's word tests (as filter's bodySlack)
	structOnes  = 0x0101010101010101
	quoteBytes  = '"' * structOnes
	escapeBytes = '\\' * structOnes
)

var (
	errTooManyMembers = BadRequest("", "the request body has more than 4096 top-level members")
	errTooDeep        = BadRequest("", "the request body nests arrays and objects more than 512 deep (its object counts as one)")
	errTooComplex     = BadRequest("", "the request body's objects hold more than 128 KiB of keys, numbers and short strings; kvroute reads long arrays in part but objects whole: send fewer members")
)

// memberSpan is a top-level member of the body: body[key:end], from its
// key's opening quote to the end of its value (offsets: a body is less
// than 2 GiB).
type memberSpan struct{ key, end int32 }

// cut is a part of the body the parser's view leaves out: body[from:to],
// replaced by "0" when zero (a member's value).
type cut struct {
	from, to int
	zero     bool
}

// trimmer is the first pass over a body (see readBudget).
type trimmer struct {
	// budget is the budget in force (readBudget when 0; tests set
	// others), and limit twice it (or readBudget, if more).
	budget, limit int

	cost    int // the structure read so far, by the measure above
	cuts    []cut
	removed int    // bytes of array elements left out
	view    []byte // the view, when it is not the body
	err     *Error
	// The body's top-level members, members[:n], in body (the span table
	// is the view's): what scrub and dropClientOnly read keys from. An
	// array, not a slice: each append is a few hundred bytes of Wasm in
	// trim.
	members *[maxMembers]memberSpan
	n       int
	cutBody bool // whether trim returned a view that is not the body
}

// trim returns the view of body the parser reads (body itself when
// nothing is left out) or the error a body gets for its shape. A body
// that is not structured as a JSON object is returned as is, for the
// parser to say what is wrong with it.
func (t *trimmer) trim(body []byte) ([]byte, *Error) {
	t.cost, t.cuts, t.removed, t.err, t.cutBody = 0, t.cuts[:0], 0, nil, false
	if t.budget == 0 {
		t.budget = readBudget
	}
	t.limit = max(t.budget, readBudget) * 2
	if t.budget > math.MaxInt/4 {
		t.limit = math.MaxInt
	}
	i := SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return body, nil
	}
	if t.members == nil {
		t.members = new([maxMembers]memberSpan)
	}
	t.n = 0
	for i = SkipSpace(body, i+1); i < len(body) && body[i] == '"'; t.n++ {
		if t.n == maxMembers {
			return nil, errTooManyMembers
		}
		k := i
		ke := stringEnd(body, i)
		if ke < 0 {
			return body, nil
		}
		c := SkipSpace(body, ke)
		v := SkipSpace(body, c+1)
		if c >= len(body) || body[c] != ':' || v >= len(body) {
			return body, nil
		}
		var e int
		if routedKey(body[k+1 : ke-1]) {
			e = t.value(body, v, 1)
		} else if e = valueEnd(body, v); e > v+2 && (body[v] == '{' || body[v] == '[') {
			t.leaveOut(v, e, true)
		} else if e == tooDeep {
			t.err = errTooDeep
		}
		if e < 0 {
			if t.err != nil {
				return nil, t.err
			}
			return body, nil
		}
		t.members[t.n] = memberSpan{int32(k), int32(e)}
		if i = SkipSpace(body, e); i < len(body) && body[i] == ',' {
			i = SkipSpace(body, i+1)
		}
	}
	if len(t.cuts) == 0 {
		return body, nil
	}
	t.cutBody = true
	return t.cut(body), nil
}

// leaveOut adds body[from:to] to what the view leaves out (replaced by 0
// when zero). Out of line: an append is a few hundred bytes of Wasm.
//
//go:noinline
func (t *trimmer) leaveOut(from, to int, zero bool) {
	t.cuts = append(t.cuts, cut{from, to, zero})
}

// cut returns the view of body without t.cuts. Out of line: most bodies
// have none, and each function a request enters costs it (see
// docs/performance.md, "The Wasm cost model").
//
//go:noinline
func (t *trimmer) cut(body []byte) []byte {
	view, at := t.view[:0], 0
	for _, c := range t.cuts {
		view = append(view, body[at:c.from]...)
		if c.zero {
			view = append(view, '0')
		} else {
			t.removed += c.to - c.from
		}
		at = c.to
	}
	view = append(view, body[at:]...)
	if cap(view)-len(view) < viewSlack {
		view = append(view[:len(view):len(view)], make([]byte, viewSlack)...)[:len(view)]
	}
	t.view = view
	return view
}

// routedKey reports whether a top-level key (its bytes between the
// quotes) may be one the parser reads: one of requestFields before the
// client-only ones, or any key with an escape, which may decode to one.
func routedKey(k []byte) bool {
	if hasBackslash(k) {
		return true
	}
	f := fieldOf(unsafeString(k), requestFields[:])
	return f >= 0 && f < firstClientOnly
}

// value reads the value at b[i] at nesting depth, leaving out what the
// budget does not cover, and returns its end (-1 with t.err set for a body
// to refuse, -1 alone for one that is not JSON).
func (t *trimmer) value(b []byte, i, depth int) int {
	switch c := b[i]; c {
	case '"':
		t.cost += stringCost
		return stringEnd(b, i)
	case '[', '{':
		// Whole when it fits in what is left of the budget (one scan of
		// its structure), else element by element or member by member.
		e, cost := structureCost(b, i, maxNesting-depth, max(t.budget-t.cost, 0))
		if e >= 0 {
			t.cost += cost
			return e
		}
		if e == tooDeep || depth >= maxNesting {
			t.err = errTooDeep
			return -1
		}
		if t.cost += bracketCost; c == '[' {
			return t.array(b, i, depth)
		}
		return t.object(b, i, depth)
	}
	t.cost += numberCost
	return scalarEnd(b, i)
}

// array is value for the array at b[i] that does not fit.
func (t *trimmer) array(b []byte, i, depth int) int {
	if i = SkipSpace(b, i+1); i < len(b) && b[i] == ']' {
		return i + 1
	}
	for last := -1; i < len(b); {
		if last >= 0 && t.cost >= t.budget {
			// The rest of the array: left out, up to its bracket.
			e := structureEnd(b, i, 1, maxNesting-depth)
			if e < 0 {
				if e == tooDeep {
					t.err = errTooDeep
				}
				return -1
			}
			t.leaveOut(last, e-1, false)
			return e
		}
		if c := b[i]; c-'0' <= 9 {
			// A number (a token id): read here, without value's call.
			last = i + 1
			for last < len(b) && !valueFollow[b[last]] {
				last++
			}
			t.cost += numberCost
		} else if last = t.value(b, i, depth+1); last < 0 {
			return -1
		} else if t.cost > t.limit {
			t.err = errTooComplex
			return -1
		}
		if i = SkipSpace(b, last); i < len(b) && b[i] == ']' {
			return i + 1
		}
		if i >= len(b) || b[i] != ',' {
			return -1
		}
		t.cost++
		i = SkipSpace(b, i+1)
	}
	return -1
}

// object is value for the object at b[i] that does not fit: every member
// is read (an object is never shortened).
func (t *trimmer) object(b []byte, i, depth int) int {
	for i = SkipSpace(b, i+1); i < len(b) && b[i] == '"'; {
		ke := shortPlain(b, i)
		if ke < 0 {
			if ke = stringEnd(b, i); ke < 0 {
				return -1
			}
		}
		t.cost += stringCost + 2
		c := SkipSpace(b, ke)
		v := SkipSpace(b, c+1)
		if c >= len(b) || b[c] != ':' || v >= len(b) {
			return -1
		}
		e := t.value(b, v, depth+1)
		if e < 0 {
			return -1
		}
		if t.cost > t.limit {
			t.err = errTooComplex
			return -1
		}
		if i = SkipSpace(b, e); i < len(b) && b[i] == ',' {
			i = SkipSpace(b, i+1)
		}
	}
	if i < len(b) && b[i] == '}' {
		return i + 1
	}
	return -1
}

// valueEnd returns the end of the value at b[i], a member of the
// top-level object, from its structure alone (tooDeep for one nested past
// maxNesting).
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '[', '{':
		return structureEnd(b, i, 0, maxNesting-1)
	}
	return scalarEnd(b, i)
}

// scalarEnd returns the end of the number or literal at b[i]: the next
// byte that may follow a value.
func scalarEnd(b []byte, i int) int {
	for i < len(b) && !valueFollow[b[i]] {
		i++
	}
	return i
}

var valueFollow = [256]bool{',': true, '}': true, ']': true, ' ': true, '\t': true, '\n': true, '\r': true, '"': true, '[': true, '{': true, ':': true}

// stringEnd returns the index after the string whose quote is b[i], from
// its quotes and escapes alone (-1 when it does not end in b): plain text
// by plainRun's long steps, then the next quote, 64 bytes a step, that no
// odd run of backslashes comes right before. (Searching for the quote
// alone keeps a string of escapes, as json.dumps writes text other than
// ASCII, at about the speed of plain text.)
func stringEnd(b []byte, i int) int {
	for i = plainRun(b, i+1, 0); ; i++ {
		for i+64 <= len(b) {
			w := b[i : i+64]
			if eqBytes(load64(w, 0), quoteBytes)|eqBytes(load64(w, 8), quoteBytes)|
				eqBytes(load64(w, 16), quoteBytes)|eqBytes(load64(w, 24), quoteBytes)|
				eqBytes(load64(w, 32), quoteBytes)|eqBytes(load64(w, 40), quoteBytes)|
				eqBytes(load64(w, 48), quoteBytes)|eqBytes(load64(w, 56), quoteBytes) != 0 {
				break
			}
			i += 64
		}
		for i+8 <= len(b) {
			if m := eqBytes(load64(b, i), quoteBytes); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		for i < len(b) && b[i] != '"' {
			i++
		}
		if i >= len(b) {
			return -1
		}
		k := i - 1 // the string's opening quote ends this loop at the latest
		for b[k] == '\\' {
			k--
		}
		if (i-k)&1 != 0 {
			return i + 1
		}
	}
}

// keyText is the text of the key raw (its quotes included) of a body trim
// read, decoded without the span table, which is the view's.
func (p *Parser) keyText(raw []byte) string {
	inner := raw[1 : len(raw)-1]
	if hasBackslash(inner) {
		return unsafeString(p.doc.unescape(inner))
	}
	return unsafeString(inner)
}
