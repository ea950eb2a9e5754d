package filter

import (
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/v8host"
)

// BenchmarkRouterInV8 is BenchmarkRouterInWasm on V8, the engine Envoy runs
// by default (internal/testenv/v8host: node with Liftoff off, as Envoy sets it): the
// same 16 hosts, chat requests and sizes, blocks of 25 requests sent
// alternately to the host's plain listener (no filter, bodies streamed) and
// its filtered one. CPU is the node process's (proxy and VM; the client and
// the upstreams run in the test binary), read over each block plus a 5 ms
// pause; vm-callbacks-us is the time inside the VM's callbacks, host
// functions included. "<size>/floor" runs testdata/floor, the least a
// body-routing filter does, the same way; at 8K tokens "floor+cold" adds
// as much generated code per request as the router enters, "hostcalls"
// times the router's host function calls, and "loaded" sends from 8 clients
// at once, each on its own connection.
//
// The host compiles the module eagerly (v8host.Config.CompileEagerly), so
// no request pays for compiling code it enters first, as in Envoy's steady
// state.
//
// Run it with a fixed count: go test -run '^$' -bench BenchmarkRouterInV8 -benchtime 500x ./filter/
func BenchmarkRouterInV8(b *testing.B) {
	needV8(b)
	addrs := benchUpstreams(b, 16)
	writeModule := func(name string, m []byte) string {
		path := filepath.Join(b.TempDir(), name)
		if err := os.WriteFile(path, m, 0o644); err != nil {
			b.Fatal(err)
		}
		return path
	}
	floorPath := writeModule("floor.wasm", floorModule(b))
	start := func(module, rootID, config string, timeHostCalls bool) *v8host.Host {
		h, err := v8host.Start(v8host.Config{Module: module, RootID: rootID, Configuration: config, Upstreams: addrs,
			TimeHostCalls: timeHostCalls, CompileEagerly: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(h.Close)
		return h
	}
	routerConfig := "{" + endpointsJSON(addrs) + "}"
	router := start(testenv.ModulePath(b), RootRouter, routerConfig, false)
	floor := start(floorPath, "floor", strings.Join(addrs, ","), false)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 20 * time.Second}
	loadedClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}, Timeout: 20 * time.Second}
	send := func(url, body string) {
		if err := postOK(client, url+"/v1/chat/completions", body); err != nil {
			b.Fatal(err)
		}
	}
	stats := func(h *v8host.Host) v8host.Stats {
		s, err := h.StatsWithSamples()
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	for _, size := range benchSizes {
		body := size.bodies()
		plainBody := body
		// run sends n requests to url and returns the node process's CPU
		// time over them, read after a settle pause (on_log and on_delete may
		// run after the client has its response).
		// With clients > 1 that many send at once, each on its own
		// connection ("loaded").
		clients := 1
		run := func(h *v8host.Host, url string, from, n int) time.Duration {
			time.Sleep(5 * time.Millisecond)
			c0 := stats(h).CPU
			if clients <= 1 {
				for j := range n {
					send(url, body(from+j))
				}
			} else {
				fanOut(b, clients, n, func(j int) error {
					return postOK(loadedClient, url+"/v1/chat/completions", body(from+j))
				})
			}
			time.Sleep(5 * time.Millisecond)
			return stats(h).CPU - c0
		}
		measure := func(b *testing.B, h *v8host.Host) {
			for i := range warmRequests {
				send(h.Plain, body(i))
				send(h.Filtered, body(i))
			}
			b.SetBytes(int64(len(body(0))))
			before := stats(h)
			var plain, filtered time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i += 25 {
				n := min(25, b.N-i)
				plain += run(h, h.Plain, i, n)
				filtered += run(h, h.Filtered, i, n)
			}
			b.StopTimer()
			after := stats(h)
			n := time.Duration(b.N)
			b.ReportMetric(us(plain/n), "cpu-us/req-nofilter")
			b.ReportMetric(us(filtered/n), "cpu-us/req-filter")
			b.ReportMetric(us((filtered-plain)/n), "cpu-us/req-overhead")
			b.ReportMetric(float64(filtered)/float64(plain), "cpu-ratio")
			b.ReportMetric(us((after.Callbacks-before.Callbacks)/n), "vm-callbacks-us")
			b.ReportMetric(us((after.PerCallback["request_body"]-before.PerCallback["request_body"])/n), "vm-body-us")
			if m, ok := after.Metrics["kvroute.router.decision_us"]; ok {
				s := append([]float64(nil), m.Samples[len(before.Metrics["kvroute.router.decision_us"].Samples):]...)
				sort.Float64s(s)
				if len(s) > 0 {
					b.ReportMetric(s[len(s)/2], "vm-decide-us")
				}
			}
			if after.HostCallCount > 0 {
				b.ReportMetric(us((after.HostCalls-before.HostCalls)/n), "vm-hostcalls-us")
				b.ReportMetric(float64(after.HostCallCount-before.HostCallCount)/float64(b.N), "hostcalls/req")
			}
			if after.Traps != 0 {
				b.Fatalf("the VM trapped: %v", after.LastErrors)
			}
		}
		b.Run(size.name, func(b *testing.B) { measure(b, router) })
		b.Run(size.name+"/floor", func(b *testing.B) { measure(b, floor) })
		if size.name != "8Ktok" {
			continue
		}
		// The floor with as much generated code per request as the router
		// enters (coldFloorModule), and the router with its host function
		// calls timed (JavaScript here, C++ in Envoy).
		b.Run(size.name+"/floor+cold", func(b *testing.B) {
			m, added := coldFloorModule(b, 150)
			measure(b, start(writeModule("cold.wasm", m), "floor", strings.Join(addrs, ","), false))
			b.ReportMetric(float64(added)/1024, "added-wasm-KB")
		})
		b.Run(size.name+"/hostcalls", func(b *testing.B) { measure(b, start(testenv.ModulePath(b), RootRouter, routerConfig, true)) })
		// A busy proxy: 8 clients at once, so the streams' callbacks
		// interleave on the VM as on a loaded Envoy worker.
		b.Run(size.name+"/loaded", func(b *testing.B) {
			clients = 8
			defer func() { clients = 1 }()
			measure(b, router)
		})
		// Streamed responses (see BenchmarkRouterInWasm): without usage
		// asked for, and with it.
		for _, sc := range streamCases {
			b.Run(size.name+"/"+sc.name, func(b *testing.B) {
				body = size.streamedBodies(sc.usage)
				defer func() { body = plainBody }()
				before := stats(router)
				measure(b, router)
				after := stats(router)
				// Every callback is counted per request, the response
				// body's chunks included.
				n := after.CallCount["response_body"] - before.CallCount["response_body"]
				if n > 0 {
					b.ReportMetric(us((after.PerCallback["response_body"]-before.PerCallback["response_body"])/time.Duration(n)), "resp-callback-us")
				}
			})
		}
	}
}
