//go:build !wasip1 || tinygo

package filter

// readRequestHeaderMap returns the request's header map, read through the
// SDK and serialized into buf. Outside the official Go Wasm build (native
// tests on the SDK's proxytest, TinyGo) no ABI bridge takes a lent buffer,
// so the SDK's pairs are the only way in.
func readRequestHeaderMap(buf []byte) ([]byte, error) {
	return sdkRequestHeaderMap(buf)
}

// readUpstreamAddress returns Envoy's upstream.address property through
// the SDK (see the Wasm build's version for why it differs there).
func readUpstreamAddress([]byte) ([]byte, error) {
	return sdkUpstreamAddress()
}
