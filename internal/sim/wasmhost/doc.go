// Package wasmhost runs a proxy-wasm module the way Envoy does, so that
// kvroute's filters can be tested and demonstrated without Envoy.
//
// It is the gateway of `kvroute demo` and of the Wasm tests, so it sits with
// the simulator (internal/sim) rather than with the test-only helpers
// (internal/testenv, whose wasmhosttest starts it behind an httptest front).
// It is not a production proxy: it speaks plain
// HTTP/1.1 on loopback, has no TLS, no retries beyond connect failures, no
// gRPC, no health checking, and it favours legible emulation over speed.
//
// # Model
//
// A Host compiles the module once with wazero (through a compilation cache,
// on disk by default) and starts Config.Workers instances of it, one per
// Envoy worker thread. Each VM runs one callback at a time. A downstream
// connection's streams all run on one VM, as a connection belongs to one
// Envoy worker (Config.Dispatch; tests can spread streams over the VMs in
// turn instead); every VM has one root context per
// Filter (plugin), created with on_context_create, on_vm_start and
// on_configure, as Envoy does for each worker. A plugin that fails to start
// makes New fail with a *PluginStartError quoting the module's log.
//
// Each request is a stream through the filter chain (Config.Filters, in
// order) and then the router, which forwards it to Config.RouteCluster. The
// response comes back through the filters in reverse order and is streamed
// to the client chunk by chunk: on_response_body runs once per upstream
// read, so server-sent events keep their boundaries, and once more, empty,
// at the end (as in Envoy: see below). Trailers are not
// emulated: the trailer maps never exist (reads and writes answer
// BadArgument) and on_*_trailers is never called.
//
// # Envoy semantics reproduced
//
// Facts from Envoy's wasm extension and proxy-wasm-cpp-host, as of Envoy
// 1.35+ with ABI 0.2.1:
//
//   - A Pause (StopIteration) returned by on_request_headers or
//     on_response_headers becomes StopAllIterationAndWatermark unless the
//     filter sets AllowOnHeadersStopIteration: the body is held by the host
//     and not delivered to the filter until it calls continue_stream. A
//     filter that waits for the body therefore never gets it (the stream
//     times out). With the setting, the body reaches on_request_body while
//     the headers wait, header changes made before resuming go upstream,
//     and returning Continue from on_request_body resumes the headers.
//   - Once a direction's headers have continued (the callback returned
//     Continue, or continue_stream ran), the filter loses that header map:
//     writes return BadArgument, get_header_map_value BadArgument, and
//     get_header_map_pairs an empty map. Header-backed request properties
//     (request.path, ...) are NotFound then too. In on_log the final maps
//     are readable again, read-only. (When headers held with StopIteration
//     resume because on_request_body returned Continue, Envoy keeps the
//     map: writes still succeed but no longer reach the upstream.)
//   - The plugin configuration buffer is readable only during
//     on_configure and the root's on_context_create (not on_vm_start);
//     otherwise NotFound.
//   - send_local_response stops the iteration whatever the callback
//     returns; the reply runs through the encoder side of the filters and
//     ends the stream. Envoy's own local replies (503 no healthy upstream
//     or connect failure, 504 upstream timeout, 408 stream idle timeout,
//     413 when a body a filter buffers with StopIterationAndBuffer passes
//     the buffer limit) take the same path. The Watermark variants,
//     including the default conversion of a Pause in headers, apply flow
//     control instead: the stream waits. A reply before the request body
//     ended carries Connection: close, and the connection closes as
//     Envoy's delayed close does: the rest of the body is read and dropped
//     for up to Config.DelayedCloseTimeout (delayed_close_timeout, 1 s), so
//     a client still sending reads the reply instead of a reset.
//   - Bodies arrive as Envoy's HTTP/1 codec delivers them, in both
//     directions: each read's bytes with end_stream false, then the end as
//     an empty chunk of its own (the codec's onBody, then the empty
//     decodeData of onMessageCompleteBase), so even a one-read body is two
//     body callbacks.
//   - At stream end every context gets on_log, then on_done and
//     on_delete, also when the client went away first.
//   - Shared data is one map per vm_id, shared by every VM, with Envoy's
//     CAS rules: a missing key is set whatever the CAS; an existing key is
//     set when the CAS is 0 or matches; every set takes the next value of
//     one counter that starts at 1 and skips 0. Shared queues are keyed by
//     (vm_id, name); the last VM to register a name gets on_queue_ready.
//   - Ticks fire per root context per VM. dispatch_http_call goes over
//     real HTTP to a named cluster and answers BadArgument for an unknown
//     cluster or a request without :method, :path or :authority; connect
//     failures and timeouts come back as 503/504 responses, as from Envoy's
//     async client. Metrics defined under one name on several VMs are one
//     stat; counters refuse non-positive increments.
//   - A trap (a Go panic that escapes, proc_exit, an out-of-bounds access)
//     marks that VM failed. Later callbacks on it are skipped; its streams
//     get 503 (fail closed, Envoy's default) or pass the filter untouched
//     (Config.FailOpen). Other VMs keep serving. Config.RemoveRequestHeaders
//     stands for a header_mutation filter ahead of the Wasm filters: it runs
//     whatever state the VMs are in.
//   - While _initialize runs, proxy_* calls other than proxy_log trap, as
//     in proxy-wasm-cpp-host. poll_oneoff answers at once with no events.
//   - Unsupported calls get Envoy's answer for an unknown target: gRPC
//     calls ParseFailure, foreign functions NotFound, proxy_done NotFound.
//
// # Host selection
//
// The router reads Config.DestinationHeader when the request headers
// reach it, after every filter ran. By default it follows Envoy's
// override_host load balancing policy: the header is a comma-separated
// list of IP:port; addresses not in the cluster are skipped; the first
// one is used and, on a connect failure, the next; with no usable address
// the fallback policy (least request, two random choices) picks. With
// Config.OriginalDst the header must hold one IP:port, which is dialed even
// outside the cluster (the SSRF exposure kvroute's filter closes by
// stripping client-supplied values).
//
// # Using it
//
//	h, err := wasmhost.New(ctx, wasmhost.Config{
//		ModulePath: "dist/kvroute.wasm",
//		VMID:       "kvroute",
//		Filters: []wasmhost.Filter{{
//			RootID:                      "kvroute.router",
//			Configuration:               `{"endpoints":[{"address":"127.0.0.1:8001"}]}`,
//			AllowOnHeadersStopIteration: true,
//		}},
//		Clusters:     map[string][]string{"engines": {"127.0.0.1:8001"}},
//		RouteCluster: "engines",
//	})
//	if err != nil { ... }          // *PluginStartError names the bad field
//	defer h.Close()
//	srv := httptest.NewServer(h)   // or go h.Serve(listener)
//
// Tests read what the module did with Metric, Metrics, CounterValue, Logs,
// LogsContaining, SharedData, SharedDataKeys, Workers, VMFailures and
// UpstreamRequests, and drive it with SetSharedData, Enqueue and FireTicks;
// Config.Clock moves the module's wall clock without waiting for it.
package wasmhost
