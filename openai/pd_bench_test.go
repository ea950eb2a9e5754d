package openai

import (
	"fmt"
	"strings"
	"testing"
)

// The body rewrites of kvroute.pd against a baseline measured in the same
// run: one validating pass over the same body (validJSON, the router's own
// validator), the least any filter that touches the JSON must pay.
// docs/performance.md reports the ratio.

func pdBenchBody(promptBytes int) []byte {
	prompt := strings.Repeat("lorem ipsum dolor sit amet ", promptBytes/27+1)[:promptBytes]
	return []byte(fmt.Sprintf(`{"model":"llama-3-8b","messages":[{"role":"user","content":%q}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":256,"temperature":0.7}`, prompt))
}

const pdBenchKV = `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3,4,5,6,7,8],"remote_engine_id":"e","remote_host":"10.0.0.21","remote_port":5600,"tp_size":1}`

func BenchmarkPDRewrite(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10, 1 << 20} {
		body := pdBenchBody(size)
		resp := []byte(`{"id":"x","choices":[{"text":"a"}],"kv_transfer_params":` + pdBenchKV + `,"usage":{"prompt_tokens":9}}`)
		b.Run(fmt.Sprintf("baseline-valid/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if !validJSON(body) {
					b.Fatal("invalid")
				}
			}
		})
		b.Run(fmt.Sprintf("vllm-prefill+decode/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				ms, ok := ParseObject(body)
				kv, ok2 := KVTransferParams(resp)
				if !ok || !ok2 || len(VLLMPrefillBody(ms)) == 0 || len(WithKVTransferParams(ms, kv)) == 0 {
					b.Fatal("rewrite failed")
				}
			}
		})
		b.Run(fmt.Sprintf("sglang-bootstrap/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				ms, ok := ParseObject(body)
				if !ok || len(WithBootstrap(ms, "10.0.0.21", 8998, BootstrapRoom())) == 0 {
					b.Fatal("rewrite failed")
				}
			}
		})
	}
}
