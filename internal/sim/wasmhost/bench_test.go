package wasmhost

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
)

// BenchmarkFilterOverhead measures what the kvroute.router filter costs per
// request in this host, against the same host with no filter, in the same
// run: each sub-benchmark runs b.N requests through both and reports the
// per-request microseconds of each and their ratio. The upstream is a
// loopback server answering a small JSON body; the client keeps its
// connection alive.
func BenchmarkFilterOverhead(b *testing.B) {
	module := testenv.Module(b)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-1","choices":[{"text":"ok"}]}`)
	}))
	defer up.Close()
	addr := up.Listener.Addr().String()
	clusters := map[string][]string{"engines": {addr}}

	base, baseURL := startHost(b, Config{Clusters: clusters, RouteCluster: "engines"})
	_ = base
	filtered, filteredURL := startHost(b, Config{Module: module, VMID: "kvroute", Clusters: clusters, RouteCluster: "engines",
		Filters: []Filter{{RootID: "kvroute.router", AllowOnHeadersStopIteration: true,
			Configuration: fmt.Sprintf(`{"endpoints":[{"address":%q}],"fallbacks":0}`, addr)}}})

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 10 * time.Second}
	send := func(b *testing.B, url, body string) {
		resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	for _, size := range []int{1 << 10, 32 << 10} {
		body := jsonBody(size)
		b.Run(fmt.Sprintf("body=%dKB", size>>10), func(b *testing.B) {
			for i := 0; i < 20; i++ { // warm connections and VMs
				send(b, baseURL, body)
				send(b, filteredURL, body)
			}
			b.SetBytes(int64(size))
			var tBase, tFilter time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				send(b, baseURL, body)
				t1 := time.Now()
				send(b, filteredURL, body)
				tFilter += time.Since(t1)
				tBase += t1.Sub(t0)
			}
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric(float64(tBase.Microseconds())/n, "us/req-nofilter")
			b.ReportMetric(float64(tFilter.Microseconds())/n, "us/req-filter")
			b.ReportMetric(float64(tFilter-tBase)/float64(time.Microsecond)/n, "us/req-overhead")
			b.ReportMetric(float64(tFilter)/float64(tBase), "ratio")
		})
	}
	if filtered.CounterValue("kvroute.router.requests.routed") == 0 {
		b.Fatal("the filter routed nothing")
	}
}
