// Package health keeps what the router learns of each engine host from the
// responses it sends there: per-host circuit breakers (consecutive failures,
// slow responses, a half-open probe), and the ORCA load report an engine
// puts in a response header.
//
// It is apart from filter because none of it touches the proxy-wasm SDK: the
// filter reads the status and the header and hands them over, so the
// breakers' state machine and the report's parser run natively in unit tests
// and fuzzing. It is apart from dispatch because it is not decision glue
// around the index and the profile: a breaker only removes a candidate
// before the decision (scorer.Host.BreakerOpen), and a load report only
// updates a candidate's load, and the simulator, which shares dispatch,
// models neither. Its state is one Envoy worker's (see Breakers).
package health
