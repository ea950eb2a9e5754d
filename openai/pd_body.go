package openai

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// Body rewrites of kvroute.pd. They copy the client's JSON object member by
// member in one pass (no unmarshal, so every field kvroute does not know
// passes through byte for byte), replacing only the members the protocol
// sets, and never look inside the prompt.

// jsonObject reports whether body is one valid JSON object.
func jsonObject(body []byte) bool {
	i := SkipSpace(body, 0)
	return i < len(body) && body[i] == '{' && validJSON(body)
}

// member is one top-level member of a JSON object: its key (unescaped) and
// its bytes from the key's opening quote to the end of the value.
type Member struct {
	key string
	raw []byte
}

// members lists a valid JSON object's top-level members in one pass,
// each value stepped over by its structure (structureEnd: eight bytes a
// step, where gjson walks strings byte by byte, which Go compiled to Wasm
// pays dearly for on a long prompt). The raw slices alias body. false for
// an object of more members than the router reads (maxMembers) or nested
// past maxNesting: each member is a string made, and the router refuses
// such a body.
func members(body []byte, dst []Member) ([]Member, bool) {
	dst = dst[:0]
	i := SkipSpace(body, 0) + 1 // past '{'
	for {
		i = SkipSpace(body, i)
		if i >= len(body) || body[i] != '"' {
			return dst, true // '}'
		}
		if len(dst) == maxMembers {
			return nil, false
		}
		start := i
		i = stringEnd(body, i)
		name := memberName(body[start:i])
		i = SkipSpace(body, i) + 1 // past ':'
		if i = valueEnd(body, SkipSpace(body, i)); i < 0 {
			return nil, false // nested too deep (body was validated)
		}
		dst = append(dst, Member{key: name, raw: body[start:i]})
		i = SkipSpace(body, i)
		if i < len(body) && body[i] == ',' {
			i++
		}
	}
}

// buildObject writes the members, leaving out those drop names, then set
// (each value raw JSON), into one exactly sized buffer. Kept members are
// copied byte for byte, in their order.
func buildObject(ms []Member, drop func(key string) bool, set ...[2]string) []byte {
	n := 2
	for _, m := range ms {
		n += len(m.raw) + 1
	}
	for _, kv := range set {
		n += len(kv[0]) + len(kv[1]) + 8
	}
	out := make([]byte, 0, n)
	out = append(out, '{')
	for _, m := range ms {
		if drop(m.key) {
			continue
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, m.raw...)
	}
	for _, kv := range set {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = gjson.AppendJSONString(out, kv[0])
		out = append(out, ':')
		out = append(out, kv[1]...)
	}
	return append(out, '}')
}

// ParseObject validates body as one JSON object and lists its members: the
// one pass over the client's body that both rewrites then share.
func ParseObject(body []byte) ([]Member, bool) {
	if !jsonObject(body) {
		return nil, false
	}
	return members(body, make([]Member, 0, 16))
}

// ObjectReader lists the members of a client's request body as the router
// reads a request: through the read budget's first pass (see readBudget),
// validating only what it keeps, so that no body shape costs kvroute.pd
// much more than plain text of its size. Scope: one worker (its buffers
// are kept for the next body).
type ObjectReader struct {
	trim  trimmer
	spans jsonSpans
}

// Members is ParseObject for a client's body: false for one that is not a
// JSON object in what the budget keeps, or that the budget refuses (more
// than maxMembers top-level members, nesting past maxNesting, objects past
// its limit), which then goes on without a prefill, as a body that is not
// JSON does. What the budget leaves out is not validated: the engines are.
func (r *ObjectReader) Members(body []byte) ([]Member, bool) {
	view, err := r.trim.trim(body)
	if err != nil {
		return nil, false
	}
	if i := SkipSpace(view, 0); i >= len(view) || view[i] != '{' || !scanJSON(view, &r.spans) {
		return nil, false
	}
	ms := make([]Member, 0, r.trim.n)
	for _, m := range r.trim.members[:r.trim.n] {
		raw := body[m.key:m.end]
		ms = append(ms, Member{key: memberName(raw[:stringEnd(raw, 0)]), raw: raw})
	}
	return ms, true
}

// memberName is the text of a member's key (key holds its quotes), decoded
// as the engine's JSON decoder reads it: "str\u0065am" is "stream".
func memberName(key []byte) string {
	if bytes.IndexByte(key, '\\') >= 0 {
		return gjson.ParseBytes(key).Str
	}
	return string(key[1 : len(key)-1])
}

func hasMember(ms []Member, key string) bool {
	for _, m := range ms {
		if m.key == key {
			return true
		}
	}
	return false
}

// VLLMPrefillBody is the prefill-only copy of a request for vLLM's
// NixlConnector: no streaming, one output token, the KV kept for a remote
// decode. The client's body is not modified.
func VLLMPrefillBody(ms []Member) []byte {
	set := [][2]string{{"stream", "false"}, {"max_tokens", "1"}}
	if hasMember(ms, "max_completion_tokens") {
		set = append(set, [2]string{"max_completion_tokens", "1"})
	}
	set = append(set, [2]string{"kv_transfer_params", VLLMPrefillParams})
	return buildObject(ms, func(k string) bool {
		switch k {
		case "stream", "max_tokens", "max_completion_tokens", "kv_transfer_params", "stream_options", "min_tokens":
			return true
		}
		return false
	}, set...)
}

// KVTransferParams returns the top-level kv_transfer_params object of a
// prefill response exactly as its bytes were sent.
func KVTransferParams(resp []byte) ([]byte, bool) {
	ms, ok := ParseObject(resp)
	if !ok {
		return nil, false
	}
	var kv []byte
	for _, m := range ms {
		if m.key == "kv_transfer_params" {
			kv = m.raw // the last one wins, as in every JSON decoder
		}
	}
	if kv == nil {
		return nil, false
	}
	// raw is `"kv_transfer_params":<value>` with optional spaces.
	i := SkipSpace(kv, skipString(kv, 0))
	v := kv[SkipSpace(kv, i+1):]
	if len(v) == 0 || v[0] != '{' {
		return nil, false
	}
	return append([]byte(nil), v...), true
}

// WithKVTransferParams is the client's body with kv_transfer_params set to
// kv, replacing any the client sent.
func WithKVTransferParams(ms []Member, kv []byte) []byte {
	return buildObject(ms, func(k string) bool { return k == "kv_transfer_params" }, [2]string{"kv_transfer_params", string(kv)})
}

// WithBootstrap is the client's body with SGLang's bootstrap fields
// (replacing any the client sent).
func WithBootstrap(ms []Member, host string, port int, room uint64) []byte {
	return buildObject(ms, func(k string) bool {
		return k == "bootstrap_host" || k == "bootstrap_port" || k == "bootstrap_room"
	},
		[2]string{"bootstrap_host", string(gjson.AppendJSONString(nil, host))},
		[2]string{"bootstrap_port", strconv.Itoa(port)},
		[2]string{"bootstrap_room", strconv.FormatUint(room, 10)},
	)
}

// BootstrapRoom is a random 63-bit room id, as SGLang's router draws it
// (rooms must not collide between concurrent requests of one prefill
// server).
func BootstrapRoom() uint64 { return rand.Uint64() >> 1 }

// SplitAddress splits "host:port" or "[v6]:port"; the host comes back
// without brackets, as SGLang's bootstrap_host wants it.
func SplitAddress(addr string) (host string, port int, ok bool) {
	i := strings.LastIndexByte(addr, ':')
	if i <= 0 {
		return "", 0, false
	}
	host = addr[:i]
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	port, err := strconv.Atoi(addr[i+1:])
	if err != nil || port < 1 || port > 65535 || host == "" {
		return "", 0, false
	}
	return host, port, true
}

// VLLMPrefillParams is what vLLM's NixlConnector expects on the prefill
// request: compute the prompt and keep its KV for a remote decode.
const VLLMPrefillParams = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`
