package filter

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Body rewrites of kvroute.pd. They copy the client's JSON object member by
// member in one pass (no unmarshal, so every field kvroute does not know
// passes through byte for byte), replacing only the members the protocol
// sets, and never look inside the prompt.

// jsonObject reports whether body is one valid JSON object.
func jsonObject(body []byte) bool {
	if !gjson.ValidBytes(body) {
		return false
	}
	for _, c := range body {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c == '{'
	}
	return false
}

// pdStringView views b as a string without copying (gjson.ParseBytes
// copies the whole body). b must not change while the view is used.
func pdStringView(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// rewriteObject copies a JSON object's top-level members in one pass,
// leaving out those drop names, and appends set (each value raw JSON). The
// members kept are copied byte for byte, in their order; set members come
// last. body must be a valid JSON object.
func rewriteObject(body []byte, drop func(key string) bool, set ...[2]string) []byte {
	extra := 2
	for _, kv := range set {
		extra += len(kv[0]) + len(kv[1]) + 8 // quotes, colon, comma, escapes of plain keys
	}
	out := make([]byte, 0, len(body)+extra)
	out = append(out, '{')
	gjson.Parse(pdStringView(body)).ForEach(func(k, v gjson.Result) bool {
		if drop(k.Str) {
			return true
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, k.Raw...)
		out = append(out, ':')
		out = append(out, v.Raw...)
		return true
	})
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

// vllmPrefillBody is the prefill-only copy of a request for vLLM's
// NixlConnector: no streaming, one output token, the KV kept for a remote
// decode. The client's body is not modified.
func vllmPrefillBody(body []byte) ([]byte, bool) {
	if !jsonObject(body) {
		return nil, false
	}
	set := [][2]string{{"stream", "false"}, {"max_tokens", "1"}}
	if gjson.GetBytes(body, "max_completion_tokens").Exists() {
		set = append(set, [2]string{"max_completion_tokens", "1"})
	}
	set = append(set, [2]string{"kv_transfer_params", vllmPrefillParams})
	return rewriteObject(body, func(k string) bool {
		switch k {
		case "stream", "max_tokens", "max_completion_tokens", "kv_transfer_params", "stream_options", "min_tokens":
			return true
		}
		return false
	}, set...), true
}

// kvTransferParams returns the top-level kv_transfer_params object of a
// prefill response exactly as its bytes were sent.
func kvTransferParams(resp []byte) ([]byte, bool) {
	if !jsonObject(resp) {
		return nil, false
	}
	kv := gjson.GetBytes(resp, "kv_transfer_params")
	if !kv.IsObject() {
		return nil, false
	}
	return []byte(kv.Raw), true
}

// withKVTransferParams is the client's body (a valid JSON object) with
// kv_transfer_params set to kv, replacing any the client sent.
func withKVTransferParams(body, kv []byte) []byte {
	return rewriteObject(body, func(k string) bool { return k == "kv_transfer_params" }, [2]string{"kv_transfer_params", string(kv)})
}

// withBootstrap is the client's body with SGLang's bootstrap fields
// (replacing any the client sent).
func withBootstrap(body []byte, host string, port int, room uint64) ([]byte, bool) {
	if !jsonObject(body) {
		return nil, false
	}
	return rewriteObject(body, func(k string) bool {
		return k == "bootstrap_host" || k == "bootstrap_port" || k == "bootstrap_room"
	},
		[2]string{"bootstrap_host", string(gjson.AppendJSONString(nil, host))},
		[2]string{"bootstrap_port", strconv.Itoa(port)},
		[2]string{"bootstrap_room", strconv.FormatUint(room, 10)},
	), true
}

// bootstrapRoom is a random 63-bit room id, as SGLang's router draws it
// (rooms must not collide between concurrent requests of one prefill
// server).
func bootstrapRoom() uint64 { return rand.Uint64() >> 1 }

// splitAddress splits "host:port" or "[v6]:port"; the host comes back
// without brackets, as SGLang's bootstrap_host wants it.
func splitAddress(addr string) (host string, port int, ok bool) {
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
