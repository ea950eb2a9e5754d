package filter

import (
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/openai"
)

// The gateway-only prefill/decode fields (kv_transfer_params,
// bootstrap_host, bootstrap_port, bootstrap_room: see firstClientOnly)
// tell an engine which host to pull KV from or pair with. A client must
// never set them, whatever the path, the mode or the spelling, so the rule
// does not depend on recognising the path (engines serve many: /invocations,
// /v1/responses, SGLang's /generate, and their HTTP servers decode %73 in a
// path): every request body the router lets through is scrubbed.
//
//   - An inference path in body mode: parse removes them (routeBody).
//   - Any other request with a body (another path, another spelling of an
//     inference path, header-only mode, a request that failed open): the
//     first byte after JSON whitespace decides. A '{' holds the body to its
//     end (up to maxBodyBytes, else 413) and forwards it without those
//     top-level members; a byte-order mark or a NUL (JSON with a BOM or in
//     UTF-16/32, which Python's json decodes from bytes) gets 400; anything
//     else (multipart uploads, plain text) goes on untouched and unbuffered.
//   - A '{' body that is not valid JSON here goes on unchanged only when it
//     cannot spell one of the fields (see openai.MayHoldClientOnly), else 400.
//
// A scrubbed body keeps its length: the removed members' bytes become
// trailing spaces, which JSON ignores. Outside body mode the headers, and
// their content-length, have already gone upstream when the body arrives.

// errFailedMidBody answers a request whose filter failed before its whole
// body arrived: what was buffered could not be checked.
var errFailedMidBody = &openai.Error{Status: 500, Message: "kvroute failed while reading the request body; retry"}

// scrubBody is on_request_body for a request the router lets through
// without deciding from its body (s.scrub): see the rule above.
func (s *routerStream) scrubBody(bodySize int, endOfStream bool) types.Action {
	p := s.plugin
	if !s.scrubJSON {
		c, found := s.peekBody(bodySize)
		if !found { // only whitespace so far
			if endOfStream {
				s.scrub = false
				return types.ActionContinue
			}
			return types.ActionPause
		}
		switch c {
		case '{':
			s.scrubJSON = true
		case 0x00, 0xEF, 0xFE, 0xFF:
			s.scrub = false
			p.stats.badRequest.Increment(1)
			return s.reject(openai.ErrNotUTF8JSON)
		default:
			s.scrub = false
			return types.ActionContinue
		}
	}
	if bodySize > p.cfg.MaxBodyBytes {
		s.scrub = false
		return s.bodyTooLarge()
	}
	if !endOfStream {
		return types.ActionPause
	}
	s.scrub = false
	if !s.scrubWhole(bodySize) {
		p.stats.badRequest.Increment(1)
		return s.reject(openai.ErrClientFieldsUnreadable)
	}
	return types.ActionContinue
}

// peekBody returns the first byte of the body after JSON whitespace; found
// is false while the bodySize bytes buffered so far are all whitespace. It
// reads only what it has not looked at yet (s.peeked).
func (s *routerStream) peekBody(bodySize int) (c byte, found bool) {
	for s.peeked < bodySize {
		// Read from the start into the router's body buffer (readBody: no
		// allocation); more than the first 4 KB only for a body that
		// starts with that much whitespace.
		b, err := s.plugin.readBody(min(bodySize, s.peeked+4096))
		if err != nil || len(b) <= s.peeked {
			return 0, false
		}
		if i := openai.SkipSpace(b, s.peeked); i < len(b) {
			return b[i], true
		}
		s.peeked = len(b)
	}
	return 0, false
}

// scrubWhole reads the whole body (bodySize bytes) and replaces it with
// itself without the gateway-only members. false: it could not be made
// safe (not JSON here and may spell one, or not replaceable).
func (s *routerStream) scrubWhole(bodySize int) bool {
	p := s.plugin
	body, err := p.readBody(bodySize)
	if err != nil {
		return bodySize == 0
	}
	clean, ok := p.parser.Scrub(body)
	if !ok {
		return false
	}
	if clean == nil {
		return true
	}
	return s.replaceBody(clean)
}

// replaceBody puts clean, the body without its gateway-only members, in
// place of the request body, and counts them.
func (s *routerStream) replaceBody(clean []byte) bool {
	p := s.plugin
	if err := proxywasm.ReplaceHttpRequestBody(clean); err != nil {
		proxywasm.LogWarnf("kvroute.router: removing client P/D fields: %v (request rejected)", err)
		return false
	}
	p.stats.clientFieldsRemoved.Increment(uint64(p.parser.Dropped()))
	return true
}

// safeScrub is scrubWhole for a request failing open at the end of its
// body: the parser may be what panicked, so a panic here falls back to
// openai.MayHoldClientOnly, which shares no code with it.
func (s *routerStream) safeScrub(bodySize int) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, trap := r.(trapPanic); trap {
				panic(r)
			}
			body, err := proxywasm.GetHttpRequestBody(0, bodySize)
			ok = err == nil && !openai.MayHoldClientOnly(body)
		}
	}()
	return s.scrubWhole(bodySize)
}
