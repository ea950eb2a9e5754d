package openai

import "math/bits"

// eqBytes has bit 7 of each byte of x set exactly where that byte is c
// (c*0x01...01 in pattern).
func eqBytes(x, pattern uint64) uint64 {
	const low7 = 0x7f7f7f7f7f7f7f7f
	t := x ^ pattern
	return ^(((t & low7) + low7) | t) & highBits
}

// gather packs the high bits of m's bytes into the low 8 bits.
func gather(m uint64) uint64 { return (m >> 7) * 0x0102040810204080 >> 56 }

// skipStructure returns the index just past the container whose opening
// bracket is b[i], reading only its structure: quotes (and the escapes
// before them) and brackets outside strings, eight bytes a step. b must be
// valid JSON there; -1 when the container does not end in b.
func skipStructure(b []byte, i int) int {
	const ones = 0x0101010101010101
	depth := 0
	var inStr, escCarry uint64 // inStr: 0xff when the word before ended in a string; escCarry: 1 when its last byte escapes the next
	for ; i+8 <= len(b); i += 8 {
		w := load64(b, i)
		q := gather(eqBytes(w, '"'*ones))
		bs := gather(eqBytes(w, '\\'*ones))
		if bs|escCarry != 0 {
			// The bytes an odd run of backslashes escapes (simdjson's
			// find_escaped, on 8 bits).
			const even = 0x55
			bs &^= escCarry
			follows := bs<<1 | escCarry
			odd := bs &^ even &^ follows
			seq := odd + bs
			escCarry = seq >> 8 & 1
			escaped := (even ^ (seq << 1)) & follows & 0xff
			q &^= escaped
		}
		// In a string from each opening quote up to its closing one.
		p := q ^ q<<1
		p ^= p << 2
		p ^= p << 4
		p = (p ^ inStr) & 0xff
		inStr = -(p >> 7) & 0xff
		v := w | 0x20*ones
		open := gather(eqBytes(v, '{'*ones)) &^ p
		cls := gather(eqBytes(v, '}'*ones)) &^ p
		if open|cls == 0 {
			continue
		}
		if depth-bits.OnesCount64(cls) > 0 {
			depth += bits.OnesCount64(open) - bits.OnesCount64(cls)
			continue
		}
		for m := open | cls; m != 0; m &= m - 1 {
			k := bits.TrailingZeros64(m)
			if open>>k&1 != 0 {
				depth++
			} else if depth--; depth == 0 {
				return i + k + 1
			}
		}
	}
	// The last bytes one at a time.
	in, esc := inStr != 0, escCarry != 0
	for ; i < len(b); i++ {
		c := b[i]
		switch {
		case esc:
			esc = false
		case in:
			if c == '\\' {
				esc = true
			} else if c == '"' {
				in = false
			}
		case c == '"':
			in = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}
