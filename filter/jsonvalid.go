package filter

import "encoding/binary"

// validJSON reports whether b is one JSON value (RFC 8259) with nothing but
// whitespace around it. It does not check UTF-8 (the caller runs
// utf8.Valid, which is fast everywhere).
//
// Why not gjson.Valid: it walks byte by byte through small functions, and
// Go code compiled to Wasm pays for every call; on wazero it validates about
// 30 MB/s, 8 ms for a 220 KB prompt. This validator is one loop with an
// explicit nesting stack, and strings (nearly all of a prompt) are skipped
// through a byte-class table, which is several times faster in Wasm.
func validJSON(b []byte) bool {
	var stack []byte // '{' or '['; nesting is bounded by the body size limit
	i := skipSpace(b, 0)
	for {
		// A value starts at b[i].
		if i >= len(b) {
			return false
		}
		switch c := b[i]; {
		case c == '{':
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == '}' {
				i++
				break
			}
			stack = append(stack, '{')
			// A key, then ':'.
			if i >= len(b) || b[i] != '"' {
				return false
			}
			if i = skipString(b, i); i < 0 {
				return false
			}
			if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
				return false
			}
			i = skipSpace(b, i+1)
			continue
		case c == '[':
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == ']' {
				i++
				break
			}
			stack = append(stack, '[')
			continue
		case c == '"':
			if i = skipString(b, i); i < 0 {
				return false
			}
		case c == '-' || (c >= '0' && c <= '9'):
			if i = skipNumber(b, i); i < 0 {
				return false
			}
		case c == 't':
			if !hasLiteral(b, i, "true") {
				return false
			}
			i += 4
		case c == 'f':
			if !hasLiteral(b, i, "false") {
				return false
			}
			i += 5
		case c == 'n':
			if !hasLiteral(b, i, "null") {
				return false
			}
			i += 4
		default:
			return false
		}
		// After a value: close containers, or a comma and the next element.
		for {
			i = skipSpace(b, i)
			if len(stack) == 0 {
				return i == len(b)
			}
			if i >= len(b) {
				return false
			}
			top := stack[len(stack)-1]
			switch {
			case b[i] == ',' && top == '[':
				i = skipSpace(b, i+1)
			case b[i] == ',' && top == '{':
				i = skipSpace(b, i+1)
				if i >= len(b) || b[i] != '"' {
					return false
				}
				if i = skipString(b, i); i < 0 {
					return false
				}
				if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
					return false
				}
				i = skipSpace(b, i+1)
			case b[i] == ']' && top == '[', b[i] == '}' && top == '{':
				stack = stack[:len(stack)-1]
				i++
				continue
			default:
				return false
			}
			break
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

func hasLiteral(b []byte, i int, lit string) bool {
	return len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit
}

// plainStringByte marks bytes a string may hold as they are: everything but
// the quote, the backslash and control characters.
var plainStringByte = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// skipString returns the index after the string starting at b[i] (a
// quote), or -1 if it is not a valid JSON string.
func skipString(b []byte, i int) int {
	i++
	for {
		// Eight bytes at a time while none of them needs a look (a prompt is
		// mostly such runs), then byte by byte.
		for i+8 <= len(b) && plainWord(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		for i < len(b) && plainStringByte[b[i]] {
			i++
		}
		if i >= len(b) {
			return -1
		}
		switch b[i] {
		case '"':
			return i + 1
		case '\\':
			if i+1 >= len(b) {
				return -1
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if len(b)-i < 6 || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return -1
				}
				i += 6
			default:
				return -1
			}
		default: // a control character
			return -1
		}
	}
}

// plainWord reports whether none of the eight bytes in x is a quote, a
// backslash or a control character (SWAR: each test sets a byte's high bit
// where the condition holds; bytes >= 0x80, UTF-8, are plain).
func plainWord(x uint64) bool {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	hasZero := func(v uint64) uint64 { return (v - ones) & ^v & highs }
	control := (x - 0x20*ones) & ^x & highs
	return control|hasZero(x^('"'*ones))|hasZero(x^('\\'*ones)) == 0
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

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
