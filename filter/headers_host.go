//go:build wasip1 && !tinygo

package filter

import (
	"unsafe"

	"github.com/kvroute/kvroute/filter/hostbuf"
)

// hostGetHeaderMapPairs is the host call behind the SDK's
// GetHttpRequestHeaders, imported here so that the request path reads the
// map in place (requestHeaders.pick) instead of through the SDK, which
// allocates a slice of pairs for it per request.
//
//go:wasmimport env proxy_get_header_map_pairs
func hostGetHeaderMapPairs(mapType uint32, retPtr, retSize *uint32) uint32

// headerMapPtr and headerMapSize receive where the host wrote the map.
// Package-level, as the ABI bridge's out-parameters are: they never live on
// a goroutine stack that could move while the host holds their address.
var headerMapPtr, headerMapSize uint32

// mapTypeRequestHeaders is proxy-wasm's map type of the request headers.
const mapTypeRequestHeaders = 0

// readRequestHeaderMap returns the request's header map in its serialized
// form, written by the host into buf (lent to the ABI bridge, see
// filter/hostbuf). A map the host did not write there (an error, a map
// larger than buf) is read again through the SDK, which allocates it and
// returns the SDK's own error.
func readRequestHeaderMap(buf []byte) ([]byte, error) {
	if cap(buf) > 0 {
		hostbuf.Lend(buf)
		status := hostGetHeaderMapPairs(mapTypeRequestHeaders, &headerMapPtr, &headerMapSize)
		hostbuf.Lend(nil)
		ptr, size := headerMapPtr, headerMapSize
		headerMapPtr, headerMapSize = 0, 0
		// The bridge hands the host the start of the lent buffer (see
		// hostbuf.Take): the map is in buf exactly when it starts there.
		if status == 0 && ptr == uint32(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))) && int(size) <= cap(buf) {
			return buf[:size], nil
		}
	}
	return sdkRequestHeaderMap(nil)
}

// hostGetProperty is the host call behind the SDK's GetProperty, imported
// so that reading upstream.address on every response neither serializes
// the path nor allocates (the SDK does both per call, and the allocation
// is the only one a routed response would make).
//
//go:wasmimport env proxy_get_property
func hostGetProperty(path *byte, pathSize uint32, retPtr, retSize *uint32) uint32

// upstreamAddressKey is upstreamAddressPath as the ABI takes a property
// path: its segments joined by NUL.
var upstreamAddressKey = []byte("upstream\x00address")

// propertyPtr and propertySize receive where the host wrote a property;
// package-level for the reason headerMapPtr is.
var propertyPtr, propertySize uint32

// readUpstreamAddress returns Envoy's upstream.address property (the host
// that served the request), written by the host into buf. Anything else
// (not set, an error, larger than buf) is read again through the SDK,
// which returns its own error.
func readUpstreamAddress(buf []byte) ([]byte, error) {
	if cap(buf) > 0 {
		hostbuf.Lend(buf)
		status := hostGetProperty(unsafe.SliceData(upstreamAddressKey), uint32(len(upstreamAddressKey)), &propertyPtr, &propertySize)
		hostbuf.Lend(nil)
		ptr, size := propertyPtr, propertySize
		propertyPtr, propertySize = 0, 0
		if status == 0 && ptr == uint32(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))) && int(size) <= cap(buf) {
			return buf[:size], nil
		}
	}
	return sdkUpstreamAddress()
}

// hostGetBufferBytes is the host call behind the SDK's GetHttpRequestBody
// and GetHttpResponseBody, imported so that the body read, once per
// request and per response chunk, enters none of the SDK's status
// mapping and buffer handover.
//
//go:wasmimport env proxy_get_buffer_bytes
func hostGetBufferBytes(buffer, start, maxSize uint32, retPtr, retSize *uint32) uint32

// bufferPtr and bufferSize receive where the host wrote a body; package-level
// for the reason headerMapPtr is.
var bufferPtr, bufferSize uint32

// readBodyInto reads the first n bytes of a body buffer into buf (lent to
// the ABI bridge; cap(buf) >= n). ok is false when the host did not write
// them there (an error, or n == 0): the caller reads through the SDK.
func readBodyInto(buf []byte, buffer uint32, n int) (b []byte, ok bool) {
	if n > 0 {
		hostbuf.Lend(buf)
		status := hostGetBufferBytes(buffer, 0, uint32(n), &bufferPtr, &bufferSize)
		hostbuf.Lend(nil)
		size := int(bufferSize)
		if status == 0 && size <= n && bufferPtr == uint32(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))) {
			b, ok = buf[:size], true
		}
		bufferPtr, bufferSize = 0, 0
	}
	return b, ok
}

// hostReplaceHeaderMapValue is the host call behind the SDK's
// ReplaceHttpRequestHeader, imported so that writing the destination
// header, once per routed request, enters none of the SDK's status
// mapping.
//
//go:wasmimport env proxy_replace_header_map_value
func hostReplaceHeaderMapValue(mapType uint32, key *byte, keySize uint32, value *byte, valueSize uint32) uint32

// setRequestHeader sets a request header through the host (which copies
// name and value) and returns the host's status as an error, nil for OK.
func setRequestHeader(name, value string) error {
	status := hostReplaceHeaderMapValue(mapTypeRequestHeaders, unsafe.StringData(name), uint32(len(name)), unsafe.StringData(value), uint32(len(value)))
	if status != statusOK {
		return hostStatusError("proxy_replace_header_map_value", status)
	}
	return nil
}

// hostGetHeaderMapValue is the host call behind the SDK's
// GetHttpResponseHeader, imported so that reading a response's :status,
// once per routed response, enters none of the SDK's status mapping and
// buffer handover.
//
//go:wasmimport env proxy_get_header_map_value
func hostGetHeaderMapValue(mapType uint32, key *byte, keySize uint32, retPtr, retSize *uint32) uint32

// mapTypeResponseHeaders is proxy-wasm's map type of the response headers.
const mapTypeResponseHeaders = 2

// readResponseHeader returns a response header's value, written by the
// host into buf (lent to the ABI bridge). ok is false when the header is
// missing or did not land there (an error, larger than buf).
func readResponseHeader(buf []byte, name string) (v []byte, ok bool) {
	if cap(buf) > 0 {
		hostbuf.Lend(buf)
		status := hostGetHeaderMapValue(mapTypeResponseHeaders, unsafe.StringData(name), uint32(len(name)), &headerMapPtr, &headerMapSize)
		hostbuf.Lend(nil)
		size := int(headerMapSize)
		if status == statusOK && size <= cap(buf) && headerMapPtr == uint32(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))) {
			v, ok = buf[:size], true
		}
		headerMapPtr, headerMapSize = 0, 0
	}
	return v, ok
}
