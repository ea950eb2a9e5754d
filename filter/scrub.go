package filter

import (
	"encoding/binary"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
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
//     cannot spell one of the fields (see mayHoldClientOnly), else 400.
//
// A scrubbed body keeps its length: the removed members' bytes become
// trailing spaces, which JSON ignores. Outside body mode the headers, and
// their content-length, have already gone upstream when the body arrives.

// errNotUTF8JSON answers a body that may be JSON in an encoding the router
// does not read.
var errNotUTF8JSON = badRequest("", "the request body starts with a byte-order mark or a NUL byte: send JSON as UTF-8 without a BOM")

// errClientFieldsUnreadable answers a body that is not valid JSON and may
// spell a gateway-only field.
var errClientFieldsUnreadable = badRequest("", "the request body is not valid JSON and may carry kv_transfer_params or bootstrap_* (set by the gateway, not by clients)")

// errFailedMidBody answers a request whose filter failed before its whole
// body arrived: what was buffered could not be checked.
var errFailedMidBody = &requestError{Status: 500, Message: "kvroute failed while reading the request body; retry"}

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
			return s.reject(errNotUTF8JSON)
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
		return s.reject(errClientFieldsUnreadable)
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
		if i := skipSpace(b, s.peeked); i < len(b) {
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
	clean, ok := p.parser.scrub(body)
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
	p.stats.clientFieldsRemoved.Increment(uint64(p.parser.dropped))
	return true
}

// safeScrub is scrubWhole for a request failing open at the end of its
// body: the parser may be what panicked, so a panic here falls back to
// mayHoldClientOnly, which shares no code with it.
func (s *routerStream) safeScrub(bodySize int) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, trap := r.(trapPanic); trap {
				panic(r)
			}
			body, err := proxywasm.GetHttpRequestBody(0, bodySize)
			ok = err == nil && !mayHoldClientOnly(body)
		}
	}()
	return s.scrubWhole(bodySize)
}

// scrub returns body without its top-level gateway-only members, padded
// with spaces to its length, or nil when it has none. ok is false when the
// body is not valid JSON here and may spell one of them. The result is
// reused by the next call.
func (p *requestParser) scrub(body []byte) (clean []byte, ok bool) {
	p.dropped = 0
	if !mayHoldClientOnly(body) {
		return nil, true // nearly every body: one pass over its bytes, no JSON walk
	}
	p.doc.checkUTF8 = true
	if !p.doc.scan(body) {
		return nil, !mayHoldClientOnly(body)
	}
	p.doc.base, p.doc.next = cap(body), 1
	p.doc.unesc = p.doc.unesc[:0]
	obj := body[skipSpace(body, 0):]
	if obj[0] != '{' {
		return nil, true
	}
	for i := skipSpace(obj, 1); ; {
		k, _, next, more := p.doc.member(obj, i)
		if !more {
			break
		}
		i = next
		if fieldOf(p.doc.text(k), requestFields[:]) >= firstClientOnly {
			p.dropped++
		}
	}
	if p.dropped == 0 {
		return nil, true
	}
	p.doc.next = 1
	out := p.dropClientOnly(body)
	for len(out) < len(body) {
		out = append(out, ' ')
	}
	p.out = out
	return out, true
}

// mayHoldClientOnly reports whether body could spell a gateway-only
// field to a JSON decoder: "kv_" or "bootstrap_" in plain bytes, a \u
// escape (a key can spell any letter so), or a NUL byte (JSON in UTF-16 or
// UTF-32). It reads bytes only: the check before scrub's JSON walk, and all
// there is for a body the JSON scan refused. Eight bytes at a time, as the
// JSON scan reads (jsonvalid.go): only a word holding a '_', a '\\' or a NUL
// is looked at byte by byte.
func mayHoldClientOnly(body []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+8 <= len(body); i += 8 {
		w := binary.LittleEndian.Uint64(body[i:])
		u, b := w^('_'*ones), w^('\\'*ones)
		if ((w-ones)&^w|(u-ones)&^u|(b-ones)&^b)&highs != 0 && spellsClientOnly(body, i, i+8) {
			return true
		}
	}
	return spellsClientOnly(body, i, len(body))
}

// spellsClientOnly is mayHoldClientOnly's byte-by-byte look at body[from:to]
// (with what precedes and follows it for context).
func spellsClientOnly(body []byte, from, to int) bool {
	for i := from; i < to; i++ {
		switch body[i] {
		case 0:
			return true
		case '\\':
			if i+1 < len(body) && body[i+1] == 'u' {
				return true
			}
		case '_':
			if i >= 2 && string(body[i-2:i]) == "kv" || i >= 9 && string(body[i-9:i]) == "bootstrap" {
				return true
			}
		}
	}
	return false
}
