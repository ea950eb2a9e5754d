package filter

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
)

// BenchmarkRouterInWasm measures what kvroute.router costs per request in
// the Wasm host with 16 candidate hosts, against the same host without the
// filter, in the same run: each iteration sends one request through each,
// alternately, and the sub-benchmark reports both per-request times, their
// difference (the filter: body copy into the VM, parse, hash, index query
// and record, decision, header writes, response callbacks) and the ratio.
//
// The "<size>/floor" sub-benchmarks run testdata/floor the same way: the
// least a body-routing Go filter can do (buffer the body, read it, set the
// destination header), so the figures also say what any such filter pays in
// this host and what kvroute adds above it. "8Ktok/floor+cold" runs the
// floor with as much generated code per request as the router enters
// (coldFloorModule): the cost of touching that code, without kvroute. At 8K tokens two more split
// kvroute's cost: "header-only" runs it with bodyRouting false (no prompt
// parsed: session, load and fallbacks, and the body held and scanned for
// client P/D fields), "pass-through" sends the request to a path the
// router does not route (no decision; its JSON body is scanned the same
// way), and "loaded" sends from 8 clients at once, each
// on its own connection (a busy proxy: streams of both workers interleave
// on the two cores). "stream" and "stream+usage" ask for a streamed
// response of streamedTokens events, without and with usage in it, and
// "stream/floor" runs the floor on the former.
//
// Each alternation first sends warmRequests requests to both hosts,
// unmeasured.
//
// vm-callbacks-us is the time spent inside the VM's callbacks per request
// (the host's CallStats, wall time, host calls included); what the CPU
// overhead has beyond it is the host's own work for the filter, and what
// the VM's code and data evicting the host's from the caches costs it.
func BenchmarkRouterInWasm(b *testing.B) {
	module := testenv.Module(b)
	floor := floorModule(b)
	addrs := benchUpstreams(b, 16)
	clusters := map[string][]string{"engines": addrs}
	start := func(cfg wasmhost.Config) (string, *wasmhost.Host) {
		h, url := wasmhosttest.Start(b, cfg)
		return url, h
	}
	baseURL, _ := start(wasmhost.Config{Clusters: clusters, RouteCluster: "engines"})
	floorURL, floorHost := start(wasmhost.Config{Module: floor, VMID: "floor", Clusters: clusters, RouteCluster: "engines",
		Filters: []wasmhost.Filter{{RootID: "floor", AllowOnHeadersStopIteration: true, Configuration: strings.Join(addrs, ",")}}})
	filterURL, fh := start(wasmhost.Config{Module: module, VMID: "kvroute", Clusters: clusters, RouteCluster: "engines",
		Filters: []wasmhost.Filter{{RootID: RootRouter, AllowOnHeadersStopIteration: true, Configuration: "{" + endpointsJSON(addrs) + "}"}}})
	headerOnlyURL, hh := start(wasmhost.Config{Module: module, VMID: "kvroute", Clusters: clusters, RouteCluster: "engines",
		Filters: []wasmhost.Filter{{RootID: RootRouter, Configuration: "{" + endpointsJSON(addrs) + `,"bodyRouting":false}`}}})

	// callbackTime is the host's total time inside the VM's callbacks.
	callbackTime := func(h *wasmhost.Host) (d time.Duration) {
		for _, c := range h.CallStats() {
			if c.Kind == "callback" {
				d += c.Total
			}
		}
		return d
	}

	// median of a histogram's samples recorded after skip.
	median := func(name string, skip int) float64 {
		m, ok := fh.Metric(name)
		if !ok || len(m.Samples) <= skip {
			return 0
		}
		s := append([]uint64(nil), m.Samples[skip:]...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return float64(s[len(s)/2])
	}
	// clients is how many send at once ("loaded"); each keeps its own
	// connection, so each stays on one worker VM, as in Envoy.
	clients := 1
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}, Timeout: 20 * time.Second}
	path := "/v1/chat/completions"
	post := func(url, body string) error { return postOK(client, url+path, body) }
	send := func(b *testing.B, url, body string) {
		if err := post(url, body); err != nil {
			b.Fatal(err)
		}
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	for _, size := range benchSizes {
		body := size.bodies()
		plainBody := body
		// alternate sends blocks of requests to the host without a filter
		// and to url in turn and returns the per-request wall and
		// whole-process CPU time of both (CPU: client, host and upstreams,
		// steadier than wall time on a shared machine). CPU is read over a
		// whole block plus a settle pause: a stream's last callbacks
		// (on_log, on_delete) and the host's bookkeeping can still run after
		// the client has the response, and a per-request reading charged
		// them to the next request, which belonged to the other host.
		alternate := func(b *testing.B, url string, h *wasmhost.Host) (tBase, tOther, cBase, cOther time.Duration) {
			for i := 0; i < warmRequests; i++ {
				send(b, baseURL, body(i))
				send(b, url, body(i))
			}
			b.SetBytes(int64(len(body(0))))
			const block, settle = 25, 5 * time.Millisecond
			run := func(b *testing.B, url string, from, n int) (wall, cpu time.Duration) {
				bodies := make([]string, n)
				for j := range bodies {
					bodies[j] = body(from + j)
				}
				time.Sleep(settle)
				c0, t0 := processCPU(), time.Now()
				if clients <= 1 {
					for _, bd := range bodies {
						send(b, url, bd)
					}
				} else {
					fanOut(b, clients, len(bodies), func(j int) error { return post(url, bodies[j]) })
				}
				wall = time.Since(t0)
				time.Sleep(settle)
				return wall, processCPU() - c0
			}
			var vm0 time.Duration
			if h != nil {
				vm0 = callbackTime(h)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i += block {
				n := min(block, b.N-i)
				w, c := run(b, baseURL, i, n)
				tBase, cBase = tBase+w, cBase+c
				w, c = run(b, url, i, n)
				tOther, cOther = tOther+w, cOther+c
			}
			b.StopTimer()
			n := time.Duration(b.N)
			if h != nil {
				b.ReportMetric(us((callbackTime(h)-vm0)/n), "vm-callbacks-us")
			}
			return tBase / n, tOther / n, cBase / n, cOther / n
		}
		b.Run(size.name, func(b *testing.B) {
			skipBody, _ := fh.Metric("kvroute.router.request_body_us")
			skipDecide, _ := fh.Metric("kvroute.router.decision_us")
			tBase, tFilter, cBase, cFilter := alternate(b, filterURL, fh)
			// Inside the VM (wall time, median): the body callback's whole work,
			// and the decision alone.
			b.ReportMetric(median("kvroute.router.request_body_us", len(skipBody.Samples)), "vm-body-us")
			b.ReportMetric(median("kvroute.router.decision_us", len(skipDecide.Samples)), "vm-decide-us")
			b.ReportMetric(us(cBase), "cpu-us/req-nofilter")
			b.ReportMetric(us(cFilter), "cpu-us/req-filter")
			b.ReportMetric(us(cFilter-cBase), "cpu-us/req-overhead")
			b.ReportMetric(us(tBase), "us/req-nofilter")
			b.ReportMetric(us(tFilter), "us/req-filter")
			b.ReportMetric(us(tFilter-tBase), "us/req-overhead")
			b.ReportMetric(float64(tFilter)/float64(tBase), "ratio")
		})
		// The same with testdata/floor in place of kvroute.router.
		b.Run(size.name+"/floor", func(b *testing.B) {
			tBase, tFloor, cBase, cFloor := alternate(b, floorURL, floorHost)
			b.ReportMetric(us(cFloor-cBase), "cpu-us/req-overhead")
			b.ReportMetric(us(tFloor-tBase), "us/req-overhead")
			b.ReportMetric(float64(tFloor)/float64(tBase), "ratio")
		})
		if size.name != "8Ktok" {
			continue
		}
		// The floor again, now also running as much generated straight-line
		// code per request as kvroute.router enters (coldFloorModule): what
		// touching that much code costs in this host, without kvroute.
		b.Run(size.name+"/floor+cold", func(b *testing.B) {
			module, added := coldFloorModule(b, 150)
			url, h := start(wasmhost.Config{Module: module, VMID: "cold", Clusters: clusters, RouteCluster: "engines",
				Filters: []wasmhost.Filter{{RootID: "floor", AllowOnHeadersStopIteration: true, Configuration: strings.Join(addrs, ",")}}})
			tBase, tCold, cBase, cCold := alternate(b, url, h)
			b.ReportMetric(float64(added)/1024, "added-wasm-KB")
			b.ReportMetric(us(cCold-cBase), "cpu-us/req-overhead")
			b.ReportMetric(us(tCold-tBase), "us/req-overhead")
		})
		split := func(name, url string, h *wasmhost.Host, reqPath string) {
			b.Run(size.name+"/"+name, func(b *testing.B) {
				path = reqPath
				defer func() { path = "/v1/chat/completions" }()
				tBase, tFilter, cBase, cFilter := alternate(b, url, h)
				b.ReportMetric(us(cFilter-cBase), "cpu-us/req-overhead")
				b.ReportMetric(us(tFilter-tBase), "us/req-overhead")
			})
		}
		b.Run(size.name+"/loaded", func(b *testing.B) {
			clients = 8
			defer func() { clients = 1 }()
			_, _, cBase, cFilter := alternate(b, filterURL, fh)
			b.ReportMetric(us(cFilter-cBase), "cpu-us/req-overhead")
			b.ReportMetric(us(cBase), "cpu-us/req-nofilter")
		})
		split("header-only", headerOnlyURL, hh, "/v1/chat/completions")
		split("pass-through", filterURL, fh, "/v1/not-routed")
		// Streamed responses of streamedTokens events each: without usage
		// asked for (the router reads none of the chunks) and with it
		// (stream_options.include_usage: it reads every chunk for the final
		// usage). resp-callbacks/req counts on_response_body calls.
		b.Run(size.name+"/stream/floor", func(b *testing.B) {
			body = size.streamedBodies(false)
			defer func() { body = plainBody }()
			_, _, cBase, cFloor := alternate(b, floorURL, floorHost)
			b.ReportMetric(us(cFloor-cBase), "cpu-us/req-overhead")
		})
		for _, sc := range streamCases {
			b.Run(size.name+"/"+sc.name, func(b *testing.B) {
				body = size.streamedBodies(sc.usage)
				defer func() { body = plainBody }()
				calls := func() (n int64, d time.Duration) {
					for _, c := range fh.CallStats() {
						if c.Name == "proxy_on_response_body" {
							n, d = n+c.Count, d+c.Total
						}
					}
					return n, d
				}
				n0, d0 := calls()
				_, _, cBase, cFilter := alternate(b, filterURL, fh)
				n1, d1 := calls()
				b.ReportMetric(us(cFilter-cBase), "cpu-us/req-overhead")
				b.ReportMetric(float64(n1-n0)/float64(b.N+warmRequests), "resp-callbacks/req")
				b.ReportMetric(us((d1-d0)/time.Duration(n1-n0)), "resp-callback-us")
			})
		}
	}
}

// warmRequests is how many requests an alternation sends to each host
// before it measures.
const warmRequests = 20

// benchCompletion is the benchmark engines' answer to a non-streamed
// request: a completion whose usage reports no cached tokens.
const benchCompletion = `{"id":"cmpl-1","choices":[{"text":"ok"}],"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`

// streamCases are the streamed benchmarks: without usage asked for, and
// with it.
var streamCases = []struct {
	name  string
	usage bool
}{{"stream", false}, {"stream+usage", true}}

// streamedTokens is how many events a streamed benchmark response has.
const streamedTokens = 64

// benchUpstreams starts n engines for the router benchmarks: a request
// with "stream":true gets streamedTokens SSE events, each flushed and
// followed by a short pause (then a
// usage event if the request asked for it, and [DONE]); any other request
// one JSON completion with usage.
func benchUpstreams(b testing.TB, n int) []string {
	var addrs []string
	for i := 0; i < n; i++ {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, _ := io.ReadAll(r.Body)
			if !bytes.Contains(req, []byte(`"stream":true`)) {
				w.Header().Set("content-type", "application/json")
				io.WriteString(w, benchCompletion)
				return
			}
			w.Header().Set("content-type", "text/event-stream")
			f, _ := w.(http.Flusher)
			for range streamedTokens {
				io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok"}}]}`+"\n\n")
				f.Flush()
				// An engine sends a token every few milliseconds; a pause
				// keeps the events in reads of their own, as they reach
				// Envoy.
				time.Sleep(200 * time.Microsecond)
			}
			if bytes.Contains(req, []byte(`"include_usage":true`)) {
				io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`+"\n\n")
			}
			io.WriteString(w, "data: [DONE]\n\n")
		}))
		b.Cleanup(up.Close)
		addrs = append(addrs, up.Listener.Addr().String())
	}
	return addrs
}

// benchSizes are the prompt sizes the router benchmarks measure.
var benchSizes = []benchSize{{"1Ktok", 4 << 10}, {"8Ktok", 32 << 10}, {"32Ktok", 128 << 10}, {"220KB", 220 << 10}}

type benchSize struct {
	name  string
	bytes int
}

// bodies returns the benchmark's chat requests by number: a shared system
// prompt (most of the body) and a varying question.
func (s benchSize) bodies() func(i int) string {
	system := strings.Repeat("You are a careful assistant for the kvroute benchmark. ", s.bytes/55)
	return func(i int) string { return chatBody(system, fmt.Sprintf("question number %d", i)) }
}

// streamedBodies is bodies asking for a streamed response, with
// stream_options.include_usage when usage is set.
func (s benchSize) streamedBodies(usage bool) func(i int) string {
	plain := s.bodies()
	extra := `,"stream":true}`
	if usage {
		extra = `,"stream":true,"stream_options":{"include_usage":true}}`
	}
	return func(i int) string {
		b := plain(i)
		return b[:len(b)-1] + extra
	}
}

// fanOut runs send(0) ... send(n-1) from clients goroutines at once, each
// taking the next index when it is done with one, and reports errors to b.
func fanOut(b testing.TB, clients, n int, send func(j int) error) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range clients {
		wg.Go(func() {
			for j := range next {
				if err := send(j); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for j := range n {
		next <- j
	}
	close(next)
	wg.Wait()
}

// postOK posts a JSON body and fails unless the answer is 200.
func postOK(client *http.Client, url, body string) error { return postStatus(client, url, body, 200) }

// postStatus is postOK for a request that must get status.
func postStatus(client *http.Client, url, body string, status int) error {
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != status {
		return fmt.Errorf("status %d, want %d", resp.StatusCode, status)
	}
	return nil
}
