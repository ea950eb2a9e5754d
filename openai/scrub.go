package openai

import "encoding/binary"

// Removing the gateway-only prefill/decode fields from a body a client
// sent: the JSON side of the router's scrub rule (filter/scrub.go).

// ErrNotUTF8JSON answers a body that may be JSON in an encoding the router
// does not read.
var ErrNotUTF8JSON = BadRequest("", "the request body starts with a byte-order mark or a NUL byte: send JSON as UTF-8 without a BOM")

// ErrClientFieldsUnreadable answers a body that is not valid JSON and may
// spell a gateway-only field.
var ErrClientFieldsUnreadable = BadRequest("", "the request body is not valid JSON and may carry kv_transfer_params or bootstrap_* (set by the gateway, not by clients)")

// scrub returns body without its top-level gateway-only members, padded
// with spaces to its length, or nil when it has none. ok is false when the
// body may spell one of them and is not valid JSON here (in what the read
// budget reads of it) or is refused by the read budget. The result is
// reused by the next call.
func (p *Parser) Scrub(body []byte) (clean []byte, ok bool) {
	p.dropped = 0
	if !MayHoldClientOnly(body) {
		return nil, true // nearly every body: one pass over its bytes, no JSON walk
	}
	// The view the read budget leaves (see readBudget), as the router
	// reads a request: what it leaves out is the engine's to check, and
	// the top-level members are the body's. A body it refuses (more
	// members than it reads, nesting too deep) may hide a member: refused
	// here too.
	view, err := p.trim.trim(body)
	if err != nil {
		return nil, false
	}
	p.doc.checkUTF8 = true
	if !p.doc.scan(view) {
		return nil, false // it may spell one: MayHoldClientOnly above
	}
	if view[SkipSpace(view, 0)] != '{' {
		return nil, true
	}
	// The top-level members as the first pass found them in body.
	p.doc.unesc = p.doc.unesc[:0]
	for _, m := range p.trim.members[:p.trim.n] {
		if p.clientOnly(body[m.key:m.end]) {
			p.dropped++
		}
	}
	if p.dropped == 0 {
		return nil, true
	}
	out := p.dropClientOnly(body)
	for len(out) < len(body) {
		out = append(out, ' ')
	}
	p.out = out
	return out, true
}

// MayHoldClientOnly reports whether body could spell a gateway-only
// field to a JSON decoder: "kv_" or "bootstrap_" in plain bytes, a \u
// escape (a key can spell any letter so), or a NUL byte (JSON in UTF-16 or
// UTF-32). It reads bytes only: the check before scrub's JSON walk, and all
// there is for a body the JSON scan refused. Eight bytes at a time, as the
// JSON scan reads (jsonvalid.go): only a word holding a '_', a '\\' or a NUL
// is looked at byte by byte.
func MayHoldClientOnly(body []byte) bool {
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

// spellsClientOnly is MayHoldClientOnly's byte-by-byte look at body[from:to]
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
