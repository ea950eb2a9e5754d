package openai

import "math/bits"

// eqBytes has bit 7 of each byte of x set exactly where that byte is c
// (pattern is c*0x0101010101010101).
func eqBytes(x, pattern uint64) uint64 {
	const low7 = 0x7f7f7f7f7f7f7f7f
	t := x ^ pattern
	return ^(((t & low7) + low7) | t) & highBits
}

// gather packs the high bits of m's bytes into its low 8 bits (byte k's
// as bit k).
func gather(m uint64) uint64 { return (m >> 7) * 0x0102040810204080 >> 56 }

// structureEnd returns the index just past the bracket that closes the
// depth containers b[i] is in (depth 0: the container whose opening
// bracket is b[i]; b[i] is not in a string), reading only the structure:
// quotes (less those escapes take) and brackets outside strings, eight
// bytes a step. It checks nothing else: -1 when the containers do not end
// in b, tooDeep when they nest past deepest.
//
// Its word's masks are written out here and in structureCost rather than
// in a function of their own, which Go does not inline: in Go's Wasm
// output a call in the loop made it twice as slow.
func structureEnd(b []byte, i, depth, deepest int) int {
	const ones = 0x0101010101010101
	var inStr, carry uint64 // inStr: 0xff when the word before ended in a string; carry: 1 when its last byte escapes the next
	for ; i+8 <= len(b); i += 8 {
		w := load64(b, i)
		q, bs := gather(eqBytes(w, '"'*ones)), gather(eqBytes(w, '\\'*ones))
		if bs|carry != 0 {
			var escaped uint64
			escaped, carry = escapes(bs, carry)
			q &^= escaped
		}
		// In a string from each opening quote up to its closing one: a
		// running parity of the quotes.
		p := q ^ q<<1
		p ^= p << 2
		p = (p ^ p<<4 ^ inStr) & 0xff
		inStr = -(p >> 7) & 0xff
		// '{' and '[' are one byte with 0x20 set, as are '}' and ']'.
		v := w | 0x20*ones
		open, cls := gather(eqBytes(v, '{'*ones))&^p, gather(eqBytes(v, '}'*ones))&^p
		if open|cls == 0 {
			continue
		}
		if nOpen, nClose := bits.OnesCount64(open), bits.OnesCount64(cls); depth > nClose && depth+nOpen <= deepest {
			depth += nOpen - nClose // it neither closes nor goes too deep here
			continue
		}
		// Brackets at a low depth (batches of token ids, small objects
		// after a cut): the lowest and highest depth in the word, four
		// bytes a lookup.
		lo, hi := nibbleDepth[(open&15|cls&15<<4)&0xff], nibbleDepth[(open>>4|cls>>4<<4)&0xff]
		if depth+int(min(lo.low, lo.net+hi.low)) > 0 && depth+int(max(lo.high, lo.net+hi.high)) <= deepest {
			depth += int(lo.net + hi.net)
			continue
		}
		// The word that closes the containers or goes too deep: rare, so
		// brackets' call costs nothing here.
		e, d := brackets(open, cls, depth, deepest)
		if e > 0 {
			return i + e
		} else if e < 0 {
			return tooDeep
		}
		depth = d
	}
	return structureTail(b, i, depth, deepest, inStr != 0, carry != 0)
}

// structureCost is structureEnd for the container whose opening bracket
// is b[i] that also returns what it costs by the read budget's measure
// (see readBudget: a byte outside strings 1, a string stringCost, a
// bracket bracketCost), and gives up (end -1) once that passes allowance.
// A string that goes on past the word after it (a prompt, a message's
// text) is stepped over by stringEnd's long steps.
func structureCost(b []byte, i, deepest, allowance int) (end, cost int) {
	const ones = 0x0101010101010101
	var inStr, carry uint64
	depth := 0
	for ; i+8 <= len(b); i += 8 {
		w := load64(b, i)
		q, bs := gather(eqBytes(w, '"'*ones)), gather(eqBytes(w, '\\'*ones))
		if bs|carry != 0 {
			var escaped uint64
			escaped, carry = escapes(bs, carry)
			q &^= escaped
		}
		p := q ^ q<<1
		p ^= p << 2
		p = (p ^ p<<4 ^ inStr) & 0xff
		inStr = -(p >> 7) & 0xff
		v := w | 0x20*ones
		open, cls := gather(eqBytes(v, '{'*ones))&^p, gather(eqBytes(v, '}'*ones))&^p
		if cost += 8 - bits.OnesCount64(p) + bits.OnesCount64(q)*(stringCost/2) + bits.OnesCount64(open|cls)*bracketCost; cost > allowance {
			return -1, cost
		}
		if open|cls == 0 {
			if inStr != 0 && i+16 <= len(b) && eqBytes(load64(b, i+8), '"'*ones) == 0 {
				// stringEnd finds the closing quote from the quote
				// search and the backslashes before it, whatever carry
				// says.
				e := stringEnd(b, i+7)
				if e < 0 {
					return -1, cost
				}
				cost += stringCost / 2      // its closing quote
				i, inStr, carry = e-8, 0, 0 // the loop adds 8
			}
			continue
		}
		e, d := brackets(open, cls, depth, deepest)
		if e > 0 {
			return i + e, cost
		} else if e < 0 {
			return tooDeep, cost
		}
		depth = d
	}
	return structureTail(b, i, depth, deepest, inStr != 0, carry != 0), cost
}

// brackets applies a word's opening and closing brackets (bit k for byte
// k) to depth: the byte after the bracket that brings it to 0 (1 to 8),
// or -1 for the one that takes it past deepest, or 0 and the new depth.
func brackets(open, cls uint64, depth, deepest int) (end, newDepth int) {
	if nOpen, nClose := bits.OnesCount64(open), bits.OnesCount64(cls); depth > nClose && depth+nOpen <= deepest {
		return 0, depth + nOpen - nClose // it neither closes nor goes too deep here
	}
	for m := open | cls; m != 0; m &= m - 1 {
		k := bits.TrailingZeros64(m)
		if open>>k&1 == 0 {
			if depth--; depth == 0 {
				return k + 1, 0
			}
		} else if depth++; depth > deepest {
			return -1, 0
		}
	}
	return 0, depth
}

// structureTail is structureEnd for the last bytes, one at a time.
func structureTail(b []byte, i, depth, deepest int, in, esc bool) int {
	for ; i < len(b); i++ {
		switch c := b[i]; {
		case esc:
			esc = false
		case in:
			esc, in = c == '\\', c != '"'
		case c == '"':
			in = true
		case c == '{' || c == '[':
			if depth++; depth > deepest {
				return tooDeep
			}
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// escapes returns the bytes of a word that backslashes escape, from its
// backslashes bs (8 bits, byte k as bit k) and carry (1 when its first
// byte is escaped by the word before), and the carry into the next word:
// the byte after each odd run of backslashes (simdjson's find_escaped, on
// 8 bits).
func escapes(bs, carry uint64) (escaped, next uint64) {
	const even = 0x55
	bs &^= carry
	follows := bs<<1 | carry
	seq := bs&^even&^follows + bs
	return (even ^ seq<<1) & follows & 0xff, seq >> 8 & 1
}

// tooDeep is structureEnd's end for containers nested past its deepest.
const tooDeep = -2

// nibbleDepth is, for four bytes' opening brackets (bits 0-3) and closing
// ones (bits 4-7), the change of depth across them and the lowest and
// highest change after any of them.
var nibbleDepth = func() (t [256]struct{ net, low, high int8 }) {
	for k := range t {
		d, low, high := int8(0), int8(0), int8(0)
		for b := range 4 {
			if k>>b&1 != 0 {
				d++
			} else if k>>(b+4)&1 != 0 {
				d--
			}
			low, high = min(low, d), max(high, d)
		}
		t[k].net, t[k].low, t[k].high = d, low, high
	}
	return t
}()
