// Package hostbuf lets filter code lend the ABI bridge a buffer for the
// next memory the host asks the module for.
//
// In proxy-wasm, every host call that returns bytes (a body, a header map,
// shared data) first calls the module's proxy_on_memory_allocate export for
// room to write them, and the bridge (internal/deploy/wasmbuild/abibridge) answers with a fresh
// Go allocation: the SDK hands that memory to its caller as a []byte it may
// keep. For a request body that is one large allocation per request, and in
// Go compiled to Wasm a large allocation costs far more than the copy (it is
// zeroed, then swept and collected by a single-threaded GC that runs inside
// the callbacks): on wazero it is most of the time a large body's read takes.
//
// A caller that does not keep the bytes beyond its own use lends a buffer
// of its own before the host call and takes it back after:
//
//	hostbuf.Lend(buf)
//	body, err := proxywasm.GetHttpRequestBody(0, n)
//	hostbuf.Lend(nil)
//
// The bridge's allocator takes the lent buffer for the first allocation
// that fits (and then forgets it), so the host writes the body into memory
// the caller reuses request after request. Anything else allocates as
// before. Outside the Wasm build (native tests, proxytest) nothing takes the
// buffer and the SDK call allocates as usual, so code must be correct
// either way: it must treat the result as valid only until it lends the
// buffer again.
//
// The package imports nothing, so the bridge (compiled into the SDK's
// internal package for the Wasm build) can import it without a cycle.
package hostbuf

// lent is the buffer on offer, nil when none. A VM runs one thread, so no
// locking is needed.
var lent []byte

// Lend offers b (its whole capacity) for the next host allocation that
// fits; nil withdraws the offer.
func Lend(b []byte) { lent = b }

// Take returns the lent buffer cut to size and withdraws it, or nil when
// none is lent or it is too small. Only the ABI bridge calls it.
func Take(size int) []byte {
	if lent == nil || cap(lent) < size || size == 0 {
		return nil
	}
	b := lent[:size:size]
	lent = nil
	return b
}
