package filter

import (
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// Body rewrites of kvroute.pd. They edit the client's JSON in place with
// sjson (no unmarshal, so every field kvroute does not know passes through
// byte for byte) and never look at the prompt.

// jsonObject reports whether body is one valid JSON object.
func jsonObject(body []byte) bool {
	return gjson.ValidBytes(body) && gjson.ParseBytes(body).IsObject()
}

// vllmPrefillBody is the prefill-only copy of a request for vLLM's
// NixlConnector: no streaming, one output token, the KV kept for a remote
// decode. The client's body is not modified.
func vllmPrefillBody(body []byte) ([]byte, bool) {
	if !jsonObject(body) {
		return nil, false
	}
	out := append([]byte(nil), body...)
	var err error
	set := func(path, raw string) {
		if err == nil {
			out, err = sjson.SetRawBytes(out, path, []byte(raw))
		}
	}
	del := func(path string) {
		if err == nil && gjson.GetBytes(out, path).Exists() {
			out, err = sjson.DeleteBytes(out, path)
		}
	}
	set("stream", "false")
	set("max_tokens", "1")
	if gjson.GetBytes(body, "max_completion_tokens").Exists() {
		set("max_completion_tokens", "1")
	}
	del("stream_options")
	del("min_tokens")
	set("kv_transfer_params", vllmPrefillParams)
	return out, err == nil
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

// withKVTransferParams is the client's body with kv_transfer_params set to
// kv (replacing any the client sent).
func withKVTransferParams(body, kv []byte) ([]byte, error) {
	return sjson.SetRawBytes(append([]byte(nil), body...), "kv_transfer_params", kv)
}

// withBootstrap is the client's body with SGLang's bootstrap fields.
func withBootstrap(body []byte, host string, port int, room uint64) ([]byte, bool) {
	if !jsonObject(body) {
		return nil, false
	}
	out, err := sjson.SetBytes(append([]byte(nil), body...), "bootstrap_host", host)
	if err == nil {
		out, err = sjson.SetRawBytes(out, "bootstrap_port", strconv.AppendInt(nil, int64(port), 10))
	}
	if err == nil {
		out, err = sjson.SetRawBytes(out, "bootstrap_room", strconv.AppendUint(nil, room, 10))
	}
	return out, err == nil
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
