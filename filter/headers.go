package filter

import (
	"encoding/binary"
	"errors"
	"strings"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
)

// internalHeaderPrefix marks headers kvroute sets for its own use. A client
// must never be able to supply one.
const internalHeaderPrefix = "x-kvroute-"

// DataParallelRankHeader names the data-parallel rank of an endpoint that
// serves several (vLLM's X-data-parallel-rank, which SGLang honours too,
// both case-insensitively). The router sets it for a rank it chose and
// strips a client's: a client must not pick a rank past the index.
const DataParallelRankHeader = "x-data-parallel-rank"

// stripRoutingHeaders removes every client-supplied routing header from the
// request: the destination header h.destination (with ORIGINAL_DST or
// override_host it would let a client pick any address: an SSRF vector) and
// kvroute's internal headers. In the same pass over the request's header
// map, read in the one host call it needs anyway, it picks out the values
// the request path reads (see requestHeaders and pick), so that the caller
// reads them without a host call (and a copy into the VM) for each.
//
// The map is read into buf when it fits (see readRequestHeaderMap): the
// values then alias buf and are valid until buf is lent again, so a caller
// keeps one beyond that with strings.Clone. A nil buf makes the read
// allocate. When the map cannot be read, h.read stays false and nothing is
// picked.
func stripRoutingHeaders(h *requestHeaders, buf []byte) error {
	raw, err := readRequestHeaderMap(buf)
	if err != nil {
		return err
	}
	if err := h.pick(raw); err != nil {
		return err
	}
	if len(h.remove) > 0 {
		return h.removeStripped()
	}
	return nil
}

// pick reads raw, the request's header map in proxy-wasm's serialized
// form, for the values requestHeaders holds and the headers to strip. That
// form, the one the host hands the map over in, is a little-endian uint32
// count, then every pair's name and value sizes (uint32 each), then every
// name and value, each followed by a NUL. Read in place, it costs no
// allocation, where the SDK's deserializer makes a slice per request (and
// so brings the allocator's code into every request in Wasm).
func (h *requestHeaders) pick(raw []byte) error {
	if len(raw) < 4 {
		return errHeaderMap
	}
	n := int(binary.LittleEndian.Uint32(raw))
	if n > (len(raw)-4)/8 {
		return errHeaderMap
	}
	sizes, data := raw[4:4+8*n], unsafeString(raw[4+8*n:])
	// One loop over a table rather than an inlined comparison per header name:
	// each function entered costs a request (docs/performance.md).
	picks := [...]struct {
		name  string
		value *string
		found bool
	}{
		{name: ":path", value: &h.path},
		{name: ":method", value: &h.method},
		{name: "content-length", value: &h.contentLength},
		{name: h.session, value: &h.sessionKey, found: h.session == ""},
	}
	for ; len(sizes) >= 8; sizes = sizes[8:] {
		k := int(binary.LittleEndian.Uint32(sizes))
		v := int(binary.LittleEndian.Uint32(sizes[4:]))
		if k >= len(data) || v >= len(data)-k-1 { // each with its NUL
			return errHeaderMap
		}
		name, value := data[:k], data[k+1:k+1+v]
		data = data[k+v+2:]
		if h.stripped(name) {
			// The host will no longer answer for it: not picked here (see
			// pickExtra).
			h.strip(name, value)
			continue
		}
		for i := range picks {
			if pk := &picks[i]; !pk.found && headerNameIs(name, pk.name) {
				*pk.value, pk.found = value, true
			}
		}
	}
	h.read = true
	if h.extra {
		h.pickExtra(raw)
	}
	return nil
}

// pickExtra reads, from raw (which pick has checked), the configured
// headers pick does not: the prefix key and admission's priority and
// deadline, and a session header named x-kvroute-*. They are read whether
// or not they are stripped: one named x-kvroute-* (the shipped
// x-kvroute-prefix-key) is kvroute's to read and then to remove. The
// destination header is never one of them (config rejects it). Out of
// pick's line (noinline): the default configuration names none of them,
// and each function entered costs a request (docs/performance.md).
//
//go:noinline
func (h *requestHeaders) pickExtra(raw []byte) {
	n := int(binary.LittleEndian.Uint32(raw))
	sizes, data := raw[4:4+8*n], unsafeString(raw[4+8*n:])
	var found [4]bool
	for ; len(sizes) >= 8; sizes = sizes[8:] {
		k := int(binary.LittleEndian.Uint32(sizes))
		v := int(binary.LittleEndian.Uint32(sizes[4:]))
		name, value := data[:k], data[k+1:k+1+v]
		data = data[k+v+2:]
		for i, pk := range [...]struct {
			name  string
			value *string
		}{{h.prefixKeyName, &h.prefixKey}, {h.priorityName, &h.priority}, {h.deadlineName, &h.deadline}, {h.session, &h.sessionKey}} {
			if !found[i] && pk.name != "" && headerNameIs(name, pk.name) && (i < 3 || h.stripped(name)) {
				*pk.value, found[i] = value, true
			}
		}
	}
}

// errHeaderMap reports a header map the host serialized wrongly.
var errHeaderMap = errors.New("malformed header map")

// strip notes the header name for removal, and the test hook's value (an
// internal header, so always stripped). Out of pick's line (noinline): few
// requests carry one, and each function entered costs a request
// (docs/performance.md).
//
//go:noinline
func (h *requestHeaders) strip(name, value string) {
	if headerNameIs(name, testPanicHeader) {
		h.testHook = value
	}
	h.remove = append(h.remove, strings.ToLower(name))
}

// removeStripped removes the headers pick noted from the request.
func (h *requestHeaders) removeStripped() error {
	for _, name := range h.remove {
		if err := proxywasm.RemoveHttpRequestHeader(name); err != nil {
			return err
		}
	}
	return nil
}

// requestHeaders is what the request path reads of the request's headers.
// The caller names the destination and session headers; stripRoutingHeaders
// fills in the rest.
type requestHeaders struct {
	destination string // the destination header's name
	session     string // the session header's name ("" when off)
	// The other configured headers the router reads ("" when off): the
	// client's prefix key (header-only mode) and admission's priority and
	// deadline, which the operator's Envoy configuration sets; extra says
	// some header is read by pickExtra (these, or a session header named
	// x-kvroute-*).
	prefixKeyName, priorityName, deadlineName string
	extra                                     bool

	read bool // the map was read (false: nothing below was picked)
	// The first value of :path, :method, content-length and the configured
	// headers, as the request carried them before the removal ("" for a
	// header absent).
	path, method, contentLength, sessionKey string
	prefixKey, priority, deadline           string
	testHook                                string   // the test hook header's value, read before removal
	remove                                  []string // the headers to strip, in lower case
}

// stripped reports whether stripRoutingHeaders removes the header name.
func (h *requestHeaders) stripped(name string) bool {
	return headerNameIs(name, h.destination) || headerNameIs(name, DataParallelRankHeader) ||
		len(name) >= len(internalHeaderPrefix) && headerNameIs(name[:len(internalHeaderPrefix)], internalHeaderPrefix)
}

// askHost fills in the picked values from the host, one call each, for a
// request whose header map could not be read.
func (h *requestHeaders) askHost() {
	h.path, _ = proxywasm.GetHttpRequestHeader(":path")
	h.method, _ = proxywasm.GetHttpRequestHeader(":method")
	h.contentLength, _ = proxywasm.GetHttpRequestHeader("content-length")
	h.sessionKey = hostHeader(h.session)
	h.prefixKey = hostHeader(h.prefixKeyName)
	h.priority = hostHeader(h.priorityName)
	h.deadline = hostHeader(h.deadlineName)
}

// hostHeader asks the host for the request header name ("" for none).
func hostHeader(name string) string {
	if name == "" {
		return ""
	}
	v, _ := proxywasm.GetHttpRequestHeader(name)
	return v
}

// appendHeaderMap appends pairs to b in the serialized form pick reads: how
// a map the SDK returned as pairs (outside the Wasm build, or when the host
// did not write it into the lent buffer) takes that form.
func appendHeaderMap(b []byte, pairs [][2]string) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(pairs)))
	for _, kv := range pairs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(kv[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(kv[1])))
	}
	for _, kv := range pairs {
		b = append(append(b, kv[0]...), 0)
		b = append(append(b, kv[1]...), 0)
	}
	return b
}

// sdkRequestHeaderMap reads the request's header map through the SDK, which
// allocates it as pairs, and serializes it into buf.
func sdkRequestHeaderMap(buf []byte) ([]byte, error) {
	pairs, err := proxywasm.GetHttpRequestHeaders()
	if err != nil {
		return nil, err
	}
	return appendHeaderMap(buf[:0], pairs), nil
}

// headerNameIs reports whether two header names are equal, ignoring ASCII
// case. Header names are ASCII tokens, and Envoy hands them over in lower
// case; a name equal only under Unicode case folding (strings.EqualFold's
// rules: the Kelvin sign for k) is another header to Envoy and the
// upstream. The length test first settles nearly every comparison, and the
// loop keeps strings.EqualFold's Unicode tables out of the code each request
// runs.
func headerNameIs(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if lowerASCII(a[i]) != lowerASCII(b[i]) {
			return false
		}
	}
	return true
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
