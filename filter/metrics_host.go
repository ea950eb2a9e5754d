//go:build wasip1 && !tinygo

package filter

//go:wasmimport env proxy_increment_metric
func hostIncrementMetric(id uint32, offset int64) uint32

//go:wasmimport env proxy_record_metric
func hostRecordMetric(id uint32, value uint64) uint32

// Increment adds n to the counter. A status other than OK (a metric the
// host does not know) is ignored: a count lost is better than a request
// failed, where the SDK panics.
func (c metricCounter) Increment(n uint64) { hostIncrementMetric(uint32(c), int64(n)) }

// Record adds a sample to the histogram (a status other than OK is
// ignored, as Increment's is).
func (h metricHistogram) Record(v uint64) { hostRecordMetric(uint32(h), v) }
