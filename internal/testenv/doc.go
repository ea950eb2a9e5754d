// Package testenv holds kvroute's test-only helpers, in the style of
// net/http/httptest: Module reads the built filter module once per test
// binary, WaitFor and Poll wait for a condition with a bound, Serve puts a
// handler behind a front that closes with the test. Its sub-packages are
// the V8 host (v8host) and the harness that starts the wazero host behind
// an HTTP front (wasmhosttest).
//
// Only tests import anything under testenv. The wazero host itself
// (internal/sim/wasmhost) is not here: `kvroute demo` runs it, so it is
// part of the simulator. imports_test.go holds the rules that keep the
// tree's layers apart (docs/architecture.md, "Layout").
package testenv
