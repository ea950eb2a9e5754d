//go:build !wasip1 || tinygo

package filter

import "github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

// Increment adds n to the counter, through the SDK outside the official Go
// Wasm build (native tests on the SDK's proxytest, TinyGo).
func (c metricCounter) Increment(n uint64) { proxywasm.MetricCounter(c).Increment(n) }

// Record adds a sample to the histogram, through the SDK (see Increment).
func (h metricHistogram) Record(v uint64) { proxywasm.MetricHistogram(h).Record(v) }
