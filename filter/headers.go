package filter

import (
	"strings"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/filter/hostbuf"
)

// internalHeaderPrefix marks headers kvroute sets for its own use. A client
// must never be able to supply one.
const internalHeaderPrefix = "x-kvroute-"

// stripRoutingHeaders removes every client-supplied routing header from the
// request: the destination header (with ORIGINAL_DST or override_host it
// would let a client pick any address: an SSRF vector) and kvroute's internal
// headers. It returns the request's headers as they are after the removal,
// read in the one host call it needs anyway, so that the caller reads
// :path, :method and the rest without a host call (and a copy into the VM)
// for each.
//
// The map is read into buf when it fits (lent to the ABI bridge, see
// filter/hostbuf): the names and values then alias buf and are valid until
// buf is lent again, so a caller keeps a value beyond that with
// strings.Clone. A nil buf makes the read allocate.
func stripRoutingHeaders(destinationHeader string, buf []byte) (requestHeaders, error) {
	hostbuf.Lend(buf)
	pairs, err := proxywasm.GetHttpRequestHeaders()
	hostbuf.Lend(nil)
	if err != nil {
		return requestHeaders{}, err
	}
	h := requestHeaders{pairs: pairs, read: true, destination: destinationHeader}
	strip := false
	for _, kv := range pairs {
		if headerNameIs(kv[0], testPanicHeader) {
			h.testHook = kv[1]
		}
		strip = strip || h.stripped(kv[0])
	}
	if strip {
		return h, h.removeStripped()
	}
	return h, nil
}

// removeStripped removes every header stripped reports from the request.
// It is out of stripRoutingHeaders' line because few requests carry one: in
// Wasm each request pays for every part of a function it enters.
func (h *requestHeaders) removeStripped() error {
	var remove []string
	for _, kv := range h.pairs {
		if h.stripped(kv[0]) {
			remove = append(remove, strings.ToLower(kv[0]))
		}
	}
	for _, name := range remove {
		if err := proxywasm.RemoveHttpRequestHeader(name); err != nil {
			return err
		}
	}
	return nil
}

// requestHeaders is the request's header map as stripRoutingHeaders read it.
type requestHeaders struct {
	pairs       [][2]string
	read        bool // pairs holds the map (false: reading it failed)
	destination string
	testHook    string // the test hook header's value, read before removal
}

// stripped reports whether stripRoutingHeaders removes the header name.
func (h *requestHeaders) stripped(name string) bool {
	return headerNameIs(name, h.destination) ||
		len(name) >= len(internalHeaderPrefix) && headerNameIs(name[:len(internalHeaderPrefix)], internalHeaderPrefix)
}

// get returns the first value of the header name, as the host's
// get_header_map_value would after the removal; when the map could not be
// read it asks the host.
func (h *requestHeaders) get(name string) (string, bool) {
	if !h.read {
		v, err := proxywasm.GetHttpRequestHeader(name)
		return v, err == nil
	}
	if h.stripped(name) {
		return "", false
	}
	for _, kv := range h.pairs {
		if headerNameIs(kv[0], name) {
			return kv[1], true
		}
	}
	return "", false
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
