package filter_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
)

// BenchmarkPDSplit measures what kvroute.pd adds to one request in the Wasm
// host: the prefill callout round trip, the body rewrites and the held
// stream, against the same request passing through the same filter
// decode-only (no prefill header), in the same run. The engines answer at
// once, so only gateway work is measured.
//
//	go test -run '^$' -bench PDSplit -benchtime 2000x -count 3 ./filter
func BenchmarkPDSplit(b *testing.B) {
	kv := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e","remote_block_ids":[1,2,3],"remote_host":"10.0.0.21","remote_port":5600}`
	prefill := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"p","choices":[{"text":"x"}],"kv_transfer_params":`+kv+`}`)
	}))
	defer prefill.Close()
	decode := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"d","choices":[{"text":"hello"}],"usage":{"prompt_tokens":9,"completion_tokens":1}}`)
	}))
	defer decode.Close()
	paddr, daddr := strings.TrimPrefix(prefill.URL, "http://"), strings.TrimPrefix(decode.URL, "http://")
	_, url := wasmhosttest.Start(b, wasmhost.Config{
		Module: testenv.Module(b), VMID: "kvroute", Workers: 1,
		Filters:      []wasmhost.Filter{{RootID: filter.RootPD, Configuration: `{}`, AllowOnHeadersStopIteration: true}},
		Clusters:     map[string][]string{decodeCluster: {daddr}, prefillCluster: {paddr}},
		RouteCluster: decodeCluster,
	})
	client := &http.Client{Timeout: 10 * time.Second}
	for _, size := range []int{4 << 10, 64 << 10} {
		body := completionOfBytes(size)
		for _, split := range []bool{false, true} {
			name := "decode-only"
			if split {
				name = "split"
			}
			b.Run(fmt.Sprintf("%s/%dKiB", name, size>>10), func(b *testing.B) {
				for b.Loop() {
					req, _ := http.NewRequest("POST", url+"/v1/completions", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set(destHeader, daddr)
					if split {
						req.Header.Set(filter.PrefillHostHeader, paddr)
					}
					resp, err := client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					want := ""
					if split {
						want = "prefill=remote"
					}
					if m := resp.Header.Get(markerHeader); resp.StatusCode != 200 || m != want {
						b.Fatalf("status %d marker %q, want 200 %q", resp.StatusCode, m, want)
					}
				}
			})
		}
	}
}

func completionOfBytes(n int) string {
	return fmt.Sprintf(`{"model":"llama-3-8b","prompt":%q,"max_tokens":16,"stream":false}`, prompt(n/4, "bench"))
}
