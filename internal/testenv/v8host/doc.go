// Package v8host runs a proxy-wasm module in V8, the Wasm engine Envoy uses
// by default, so that kvroute's module is tested on a second engine and its
// cost is measured on the one most users run.
//
// internal/sim/wasmhost, the host every other test uses, runs modules on
// wazero, a pure-Go runtime. Its figures are the project's steady reference,
// but wazero compiles every linear-memory access with an explicit bounds
// check, where Envoy's V8 relies on guard pages and a trap handler, and it
// compiles differently. What a filter costs in Envoy is closer to what it
// costs in V8; V8 also catches module bugs that one engine hides (an
// import with the wrong signature, a trap one engine forgives).
//
// # Model
//
// Node.js embeds V8. A Host starts `node --no-liftoff host.mjs` (the script
// is embedded in this package): Envoy's V8 engine (proxy-wasm-cpp-host)
// turns Liftoff off, so every function is compiled by TurboFan up front,
// and enables V8's trap handler, which Node also enables on Linux. The
// script instantiates the module once per worker with Node's WASI and the
// proxy-wasm ABI 0.2.1 host functions the module imports, starts one root
// context with the plugin configuration, and serves three HTTP listeners
// on loopback:
//
//   - filtered: every request is a stream through the filter, as Envoy's
//     HTTP connection manager runs it: on_request_headers, the body chunk by
//     chunk (held while the filter pauses, which is what
//     allow_on_headers_stop_iteration gives), the upstream chosen from the
//     destination header (its first entry), the response through
//     on_response_headers and on_response_body, then on_log, on_done and
//     on_delete. A connection stays on one worker VM.
//   - plain: the same upstreams in turn, both bodies streamed, no filter:
//     the baseline a filter's cost is measured against.
//   - admin: the host's counters as JSON (Stats): the process's CPU time,
//     the time inside the VM's callbacks, the module's metrics, traps, log
//     counts, and the properties the module asked for that the host does
//     not serve.
//
// Envoy semantics reproduced, as internal/sim/wasmhost documents them: a
// direction's header map is gone (BadArgument) once its headers have
// continued, except the request map when the body's callback resumed it;
// both are readable in on_log; the plugin configuration is readable in
// on_configure only; shared data has Envoy's CAS rule; poll_oneoff answers
// at once with no events; a trap fails the VM, and its streams get 503.
//
// A body callback that does not continue after its headers went on buffers
// the body (Envoy's StopIterationAndBuffer), and a body write
// (proxy_set_buffer_bytes) replaces what goes upstream.
//
// Not modelled: HTTP calls, gRPC, queues, trailers, ORCA and retries. The
// host functions are JavaScript, slower than Envoy's C++, so the cost
// measured here is an upper bound for those.
//
// Node.js 20 or later must be on PATH (Debian: the nodejs package; CI
// installs it when missing). Start returns an error naming what is missing.
package v8host
