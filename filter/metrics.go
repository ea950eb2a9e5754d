package filter

import "github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

// Metric names are "kvroute.<filter>.<name>"; Envoy exposes them as
// wasmcustom.kvroute.<filter>.<name> (Prometheus:
// envoy_wasmcustom_kvroute_<filter>_<name>). Counters are per VM and Envoy sums
// same-named stats across workers.

// commonStats are the counters every kvroute filter keeps.
type commonStats struct {
	recoveredPanics proxywasm.MetricCounter
	casRetries      proxywasm.MetricCounter
}

func newCommonStats(filter string) commonStats {
	return commonStats{
		recoveredPanics: proxywasm.DefineCounterMetric("kvroute." + filter + ".recovered_panics"),
		casRetries:      proxywasm.DefineCounterMetric("kvroute." + filter + ".cas_retries"),
	}
}
