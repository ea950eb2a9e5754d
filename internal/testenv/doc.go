// Package testenv is the root of kvroute's test-only helpers: the V8 host
// (v8host) and the harness that starts the wazero host behind an HTTP
// front (wasmhosttest), in the style of net/http/httptest.
//
// Only tests import anything under testenv. The wazero host itself
// (internal/sim/wasmhost) is not here: `kvroute demo` runs the module in it,
// so it is part of the simulator. imports_test.go holds the rules that
// keep the tree's layers apart.
package testenv
