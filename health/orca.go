package health

import (
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// ORCAHeader is the response header vLLM fills with ORCA load metrics when
// the request carries ORCAFormatHeader.
const (
	ORCAHeader       = "endpoint-load-metrics"
	ORCAFormatHeader = "endpoint-load-metrics-format"
)

// LoadReport is what kvroute reads from an ORCA report: one response's, which
// the filter copies into the serving host's load as this worker sees it.
type LoadReport struct {
	KVUsage          float64
	Waiting, Running int
	OK               bool // at least one metric was read
}

// maxRequests bounds a request count an engine reports: past it the value
// is garbage, and Go's conversion of a float beyond int's range to int is
// not defined (natively, 1e300 becomes a negative count, a host that looks
// idle).
const maxRequests = 1 << 30

// set records one named metric of an ORCA report; unknown names and
// out-of-range values change nothing.
func (l *LoadReport) set(name string, x float64) {
	switch name {
	case "kv_cache_usage_perc":
		if x >= 0 && x <= 1 {
			l.KVUsage, l.OK = x, true
		}
	case "num_requests_waiting":
		if x >= 0 && x <= maxRequests {
			l.Waiting, l.OK = int(x), true
		}
	case "num_requests_running":
		if x >= 0 && x <= maxRequests {
			l.Running, l.OK = int(x), true
		}
	}
}

// ParseORCA reads vLLM's endpoint-load-metrics value in TEXT
// ("TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=2.0")
// or JSON ("JSON {"named_metrics": {...}}") form. Unknown metrics are
// ignored; a malformed value reports OK=false and changes nothing.
func ParseORCA(v string) LoadReport {
	var l LoadReport
	v = strings.TrimSpace(v)
	switch {
	case strings.HasPrefix(v, "TEXT "):
		// Cut rather than Split: no slice allocated per response.
		for rest, more := v[len("TEXT "):], true; more; {
			var kv string
			kv, rest, more = strings.Cut(rest, ",")
			name, val, found := strings.Cut(strings.TrimSpace(kv), "=")
			if !found {
				continue
			}
			x, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err != nil {
				continue
			}
			l.set(strings.TrimPrefix(strings.TrimSpace(name), "named_metrics."), x)
		}
	case strings.HasPrefix(v, "JSON "):
		doc := v[len("JSON "):]
		if !gjson.Valid(doc) {
			return LoadReport{}
		}
		gjson.Get(doc, "named_metrics").ForEach(func(k, val gjson.Result) bool {
			if val.Type == gjson.Number {
				l.set(k.String(), val.Num)
			}
			return true
		})
	}
	return l
}
