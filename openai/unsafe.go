package openai

import "unsafe"

// unsafeString views b as a string without copying, for read-only searches
// of response chunks on the hot path. b must not change while it is used.
func unsafeString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
