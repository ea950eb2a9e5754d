package openai

// Reading a request's path as the server behind the gateway reads it. The
// functions keep no state.

// ModelsPath is OpenAI's model list, which clients (SDKs, UIs) read to
// learn what a server serves.
const ModelsPath = "/v1/models"

// SamePath reports whether the request path path names the configured
// path want as an engine's or a gateway's HTTP server could read it:
// percent-escapes decoded (uvicorn, behind vLLM and SGLang, decodes %73 to
// s), runs of slashes as one, a trailing slash dropped, ASCII case
// ignored. It is for matching only: the path forwarded is the client's.
func SamePath(path, want string) bool {
	i, j := 0, 0
	for {
		c, ni, okc := pathByte(path, i)
		w, nj, okw := pathByte(want, j)
		if !okc || !okw {
			return !okc && !okw
		}
		if lowerASCII(c) != lowerASCII(w) {
			return false
		}
		i, j = ni, nj
	}
}

// pathByte returns the byte of p at i as SamePath reads it, and where the
// next one starts; ok is false at the end (a trailing run of slashes is
// the end).
func pathByte(p string, i int) (c byte, next int, ok bool) {
	if i >= len(p) {
		return 0, i, false
	}
	if c, next = decodedAt(p, i); c != '/' {
		return c, next, true
	}
	// One slash for a run of them (escaped or not); none at the end.
	for next < len(p) {
		d, n := decodedAt(p, next)
		if d != '/' {
			return '/', next, true
		}
		next = n
	}
	return 0, next, false
}

// decodedAt is the byte at p[i], a percent-escape decoded, and where the
// next one starts.
func decodedAt(p string, i int) (byte, int) {
	if p[i] == '%' && i+2 < len(p) {
		if h, ok := unhex(p[i+1]); ok {
			if l, ok := unhex(p[i+2]); ok {
				return h<<4 | l, i + 3
			}
		}
	}
	return p[i], i + 1
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// ModelID returns the id of a GET /v1/models/{id} path, read as an HTTP
// server reads the path (the /v1/models/ prefix as SamePath reads it,
// the id percent-decoded and case kept). An id may hold slashes
// (meta-llama/Llama-3.1-8B), as OpenAI's SDKs send it unescaped.
func ModelID(path string) (string, bool) {
	const prefix = ModelsPath + "/"
	i := 0
	for j := 0; j < len(prefix); j++ {
		c, next, ok := pathByte(path, i)
		if !ok || lowerASCII(c) != prefix[j] {
			return "", false
		}
		i = next
	}
	if i >= len(path) {
		return "", false
	}
	id := make([]byte, 0, len(path)-i)
	for i < len(path) {
		c, next := decodedAt(path, i)
		id, i = append(id, c), next
	}
	return string(id), true
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
