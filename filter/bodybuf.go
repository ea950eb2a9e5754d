package filter

import (
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/filter/hostbuf"
)

// readBody reads the request body into p.bodyBuf (lent to the ABI bridge,
// see filter/hostbuf) instead of a fresh allocation per request: in Wasm the
// allocation, not the copy, is most of the read. The result is valid until the next readBody: the
// parser copies what outlives the callback (model, user), the hasher
// consumes the prompt, and the forwarded body is rewritten into its own
// buffer.
func (p *routerPlugin) readBody(n int) ([]byte, error) {
	return p.readBuffer(n, bufferRequestBody, proxywasm.GetHttpRequestBody)
}

// readBuffer reads n bytes of a body buffer (bufferRequestBody or
// bufferResponseBody) into p.bodyBuf, through kvroute's own host call in
// the official Go Wasm build (readBodyInto) and with get, the SDK's
// reader, otherwise. A response chunk is only scanned for cached_tokens,
// so it shares the buffer.
func (p *routerPlugin) readBuffer(n int, buffer uint32, get func(start, maxSize int) ([]byte, error)) ([]byte, error) {
	if cap(p.bodyBuf) >= n || p.growBodyBuf(n) {
		if b, ok := readBodyInto(p.bodyBuf, buffer, n); ok {
			return b, nil
		}
	}
	return p.sdkReadBuffer(n, get)
}

// sdkReadBuffer is readBuffer through the SDK: outside the official Go
// Wasm build, and in it for a response chunk larger than any request body
// the router takes (read the ordinary way rather than keep a buffer that
// size) or an answer the host did not write into p.bodyBuf. Out of line
// (noinline): in Wasm a routed request never gets here.
//
//go:noinline
func (p *routerPlugin) sdkReadBuffer(n int, get func(start, maxSize int) ([]byte, error)) ([]byte, error) {
	if cap(p.bodyBuf) < n {
		return get(0, n)
	}
	// Lend and withdraw around the one host call, without a defer (as every
	// other lender does): the defer's wrapper would be one more function
	// entered in Wasm.
	hostbuf.Lend(p.bodyBuf)
	b, err := get(0, n)
	hostbuf.Lend(nil)
	return b, err
}

// growBodyBuf makes p.bodyBuf hold n bytes, unless n is more than maxBodyBytes
// (the buffer never grows past it). Out of readBuffer's line (noinline): it
// grows only until the largest body has been seen, and each function entered
// costs a request (docs/performance.md).
//
//go:noinline
func (p *routerPlugin) growBodyBuf(n int) bool {
	if n > p.cfg.MaxBodyBytes {
		return false
	}
	p.bodyBuf = make([]byte, n, n+bodySlack)
	return true
}

// bodySlack is room past the largest body: the parser's word tests read up
// to 48 bytes past the start of a member (never using a byte past the
// body's end, see openai's object), and without room at the end of the
// buffer the members that end a body went the slow way.
const bodySlack = 64
