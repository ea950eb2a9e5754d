package wasmhost

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Status is a proxy-wasm ABI result code (WasmResult in proxy-wasm-cpp-host).
// Host functions return it to the module; the numbers are the ABI's.
type Status uint32

// The statuses the ABI defines. Envoy returns only some of them from each
// call; the host functions document which.
const (
	StatusOK                   Status = 0
	StatusNotFound             Status = 1
	StatusBadArgument          Status = 2
	StatusSerializationFailure Status = 3
	StatusParseFailure         Status = 4
	StatusBadExpression        Status = 5
	StatusInvalidMemoryAccess  Status = 6
	StatusEmpty                Status = 7
	StatusCasMismatch          Status = 8
	StatusResultMismatch       Status = 9
	StatusInternalFailure      Status = 10
	StatusBrokenConnection     Status = 11
	StatusUnimplemented        Status = 12
)

var statusNames = [...]string{"Ok", "NotFound", "BadArgument", "SerializationFailure", "ParseFailure",
	"BadExpression", "InvalidMemoryAccess", "Empty", "CasMismatch", "ResultMismatch",
	"InternalFailure", "BrokenConnection", "Unimplemented"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint32(s))
}

// ErrCasMismatch is returned by Host.SetSharedData when the compare-and-swap
// value does not match the stored one.
var ErrCasMismatch = errors.New("wasmhost: shared data CAS mismatch")

// Header map types of the ABI (WasmHeaderMapType).
const (
	mapRequestHeaders          = 0
	mapRequestTrailers         = 1
	mapResponseHeaders         = 2
	mapResponseTrailers        = 3
	mapGrpcInitialMetadata     = 4
	mapGrpcTrailingMetadata    = 5
	mapHTTPCallResponseHeaders = 6
	mapHTTPCallResponseTrailer = 7
	mapMax                     = 7
)

// Buffer types of the ABI (WasmBufferType).
const (
	bufRequestBody      = 0
	bufResponseBody     = 1
	bufDownstreamData   = 2
	bufUpstreamData     = 3
	bufHTTPCallResponse = 4
	bufGrpcReceive      = 5
	bufVMConfiguration  = 6
	bufPluginConfig     = 7
	bufCallData         = 8
	bufMax              = 8
)

// Stream types of continue_stream / close_stream.
const (
	streamRequest    = 0
	streamResponse   = 1
	streamDownstream = 2
	streamUpstream   = 3
	streamMax        = 3
)

// Metric types of define_metric; Envoy keeps the type in the low two bits of
// the metric id.
const (
	metricCounter   = 0
	metricGauge     = 1
	metricHistogram = 2
	metricTypeMask  = 3
)

// Filter statuses, as proxy-wasm-cpp-host names them. A module returns the
// raw number; the host converts it the way Envoy does.
const (
	headersContinue                     = 0
	headersStopIteration                = 1
	headersStopAllIterationAndBuffer    = 3
	headersStopAllIterationAndWatermark = 4

	dataContinue                  = 0
	dataStopIterationAndBuffer    = 1
	dataStopIterationAndWatermark = 2
	dataStopIterationNoBuffer     = 3
)

// Log levels of proxy_log.
const (
	LevelTrace    = 0
	LevelDebug    = 1
	LevelInfo     = 2
	LevelWarn     = 3
	LevelError    = 4
	LevelCritical = 5
	levelMax      = 6
)

var levelNames = [...]string{"trace", "debug", "info", "warn", "error", "critical"}

// Pair is one header (or metadata) entry. Keys of HTTP headers are lower case,
// pseudo-headers (":path", ":status", ...) included, as Envoy stores them.
type Pair struct{ Key, Value string }

// encodePairs serializes pairs in the proxy-wasm map format: a little-endian
// u32 count, then a u32 key length and u32 value length per pair, then each
// key and value followed by a NUL byte.
func encodePairs(pairs []Pair) []byte {
	if len(pairs) == 0 {
		return nil
	}
	size := 4 + 8*len(pairs)
	for _, p := range pairs {
		size += len(p.Key) + len(p.Value) + 2
	}
	b := make([]byte, size)
	binary.LittleEndian.PutUint32(b, uint32(len(pairs)))
	off := 4
	for _, p := range pairs {
		binary.LittleEndian.PutUint32(b[off:], uint32(len(p.Key)))
		binary.LittleEndian.PutUint32(b[off+4:], uint32(len(p.Value)))
		off += 8
	}
	for _, p := range pairs {
		off += copy(b[off:], p.Key)
		b[off] = 0
		off++
		off += copy(b[off:], p.Value)
		b[off] = 0
		off++
	}
	return b
}

// decodePairs parses the proxy-wasm map format. Like proxy-wasm-cpp-host's
// PairsUtil::toPairs, malformed input yields no pairs rather than an error.
func decodePairs(b []byte) []Pair {
	if len(b) < 4 {
		return nil
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n == 0 || n > (len(b)-4)/8 {
		return nil
	}
	lens := b[4 : 4+8*n]
	data := b[4+8*n:]
	pairs := make([]Pair, 0, n)
	for i := 0; i < n; i++ {
		kl := int(binary.LittleEndian.Uint32(lens[8*i:]))
		vl := int(binary.LittleEndian.Uint32(lens[8*i+4:]))
		if kl+vl+2 > len(data) || kl < 0 || vl < 0 {
			return nil
		}
		k := string(data[:kl])
		data = data[kl+1:]
		v := string(data[:vl])
		data = data[vl+1:]
		pairs = append(pairs, Pair{k, v})
	}
	return pairs
}
