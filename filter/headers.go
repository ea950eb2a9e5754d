package filter

import (
	"strings"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
)

// internalHeaderPrefix marks headers kvroute sets for its own use. A client
// must never be able to supply one.
const internalHeaderPrefix = "x-kvroute-"

// stripRoutingHeaders removes every client-supplied routing header from the
// request: the destination header (with ORIGINAL_DST or override_host it
// would let a client pick any address: an SSRF vector) and kvroute's internal
// headers. It returns the value of the test hook header, read before removal.
func stripRoutingHeaders(destinationHeader string) (testHook string, err error) {
	headers, err := proxywasm.GetHttpRequestHeaders()
	if err != nil {
		return "", err
	}
	var remove []string
	for _, h := range headers {
		name := strings.ToLower(h[0])
		if name == testPanicHeader {
			testHook = h[1]
		}
		if name == destinationHeader || strings.HasPrefix(name, internalHeaderPrefix) {
			remove = append(remove, name)
		}
	}
	for _, name := range remove {
		if err := proxywasm.RemoveHttpRequestHeader(name); err != nil {
			return testHook, err
		}
	}
	return testHook, nil
}
