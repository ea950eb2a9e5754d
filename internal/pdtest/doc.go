// Package pdtest holds the Wasm integration tests of the kvroute.pd filter:
// dist/kvroute.wasm loaded in internal/sim/wasmhost (Envoy's behaviour, with
// allow_on_headers_stop_iteration) in front of simulated prefill and decode
// engines from internal/sim/server, over real HTTP on loopback.
//
// Every engine sits behind a recording reverse proxy, so a test can compare
// what the prefill host answered with what the decode host then received,
// byte for byte. The package has no non-test code besides this comment.
package pdtest
