package filter

import "github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

// Metric names are "kvroute.<filter>.<name>", values that vary carried as
// tags (package statnames); Envoy defines them as
// wasmcustom.kvroute.<filter>.<name> and exposes them without "wasmcustom."
// (Prometheus: kvroute_<filter>_<name>). Counters are per VM and Envoy sums
// same-named stats across workers. Durations are in microseconds (_us).

// commonStats are the counters every kvroute filter keeps.
type commonStats struct {
	recoveredPanics metricCounter
	casRetries      metricCounter
}

// newCommonStats defines them under a filter's prefix (statnames.Router, statnames.PD).
func newCommonStats(filter string) commonStats {
	return commonStats{
		recoveredPanics: defineCounter(filter + "recovered_panics"),
		casRetries:      defineCounter(filter + "cas_retries"),
	}
}

// metricCounter and metricHistogram are proxy-wasm metrics by id, like
// the SDK's MetricCounter and MetricHistogram. Their updates go straight to
// the host in the official Go Wasm build (metrics_host.go): through the SDK
// each one also enters the SDK's status-to-error mapping, and a routed
// request makes about seven.
type (
	metricCounter   uint32
	metricHistogram uint32
)

func defineCounter(name string) metricCounter {
	return metricCounter(proxywasm.DefineCounterMetric(name))
}

func defineHistogram(name string) metricHistogram {
	return metricHistogram(proxywasm.DefineHistogramMetric(name))
}
