//go:build !wasip1 || tinygo

package filter

import "github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

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

// readBodyInto leaves body reads to the SDK outside the official Go Wasm
// build (see the Wasm build's version).
func readBodyInto([]byte, uint32, int) ([]byte, bool) { return nil, false }

// setRequestHeader sets a request header through the SDK outside the
// official Go Wasm build.
func setRequestHeader(name, value string) error {
	return proxywasm.ReplaceHttpRequestHeader(name, value)
}

// readResponseHeader reads a response header through the SDK outside the
// official Go Wasm build.
func readResponseHeader(buf []byte, name string) ([]byte, bool) {
	v, err := proxywasm.GetHttpResponseHeader(name)
	return []byte(v), err == nil
}
