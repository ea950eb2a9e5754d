// Package quietbody lets filter code tell the ABI bridge that a stream's
// response body chunks need no callback until its last one.
//
// A streamed completion arrives as about one chunk per token, and Envoy
// calls proxy_on_response_body for each: a thousand-token answer is a
// thousand callbacks. When the router has nothing to read in them (a stream
// that did not ask for usage, see the router's streamUsage setting), every
// one of them would still enter the SDK's dispatch, the stream's method and
// its panic guard, which costs microseconds each in a VM whose code the
// proxy's own work evicted since the last chunk. A stream marked here is
// answered Continue by the bridge's export itself; the chunk that ends the
// response still reaches the filter, which then releases the request's
// load.
//
// Outside the Wasm build (native tests, proxytest) nothing reads the marks,
// and every chunk reaches the filter: code must be correct either way.
//
// The package imports nothing, so the bridge (compiled into the SDK's
// internal package for the Wasm build) can import it without a cycle.
package quietbody

// slots is the size of the table, a power of two. Envoy gives each context
// of a VM a fresh id, counting up, so a stream's id modulo the size names a
// slot that is its own while it lives, unless the stream created slots
// contexts later on the same VM is live and marked too: the older stream
// then loses its mark and its chunks reach the filter again (slower, not
// wrong).
const slots = 1 << 10

// marked holds, per slot, the id of the stream marked there (0: none;
// stream ids are never 0).
var marked [slots]uint32

// Mark makes the bridge answer stream id's response body chunks that do not
// end the response without calling the filter.
func Mark(id uint32) { marked[id%slots] = id }

// Marked reports whether stream id is marked.
func Marked(id uint32) bool { return id != 0 && marked[id%slots] == id }
