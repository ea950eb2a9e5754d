// Package scorer is kvroute's decision layer: given the candidate hosts of one
// request and what the index believes each of them caches, it picks the host
// (and the retry fallbacks) that Envoy's override_host policy will use.
//
// # Model
//
// A decision runs one [Profile]: its [Filter]s narrow the candidates, its
// weighted [Scorer]s each give every surviving candidate a score in [0, 1],
// and its [Picker] orders them (primary first, then fallbacks). A [Handler]
// runs one profile, or two (decode, then prefill) for disaggregated fleets.
//
// Every scorer declares a [Category]: affinity (send like to like: prefix
// cache, session, LoRA), distribution (spread: queue, in-flight, pending
// tokens) or balance (protect a resource: KV utilization, latency). A profile
// that has affinity scorers and nothing that spreads load is the hotspot
// recipe — the warm host wins every request until it melts — so validation
// refuses it unless the profile opts in with allowHotspot.
//
// # Allocation discipline
//
// The package runs inside Envoy's Wasm VM, one per worker thread, where every
// allocation is garbage-collector work on the request path. Plugins therefore
// never build per-call maps: candidates are positions in the caller's
// []Host, scores are written into slices indexed by that position, and all
// per-decision buffers live in a [Scratch] the caller reuses. A steady-state
// decision allocates nothing.
//
// # Configuration
//
// Profiles are assembled from the plugin configuration, which package
// config parses ([Build] takes its result; [Load] does both): named plugin
// instances with parameters, and profiles referring to them with weights.
// Every mistake is reported with the path of the offending field, for
// example "profiles.default.scorers[2].weight: must be >= 0", and all of them
// at once. The built-in strategies ([Presets]) need no configuration.
//
// The package imports only the standard library, gjson, xxhash and
// kvroute's config and snapshot (no proxy-wasm SDK), so it compiles
// unchanged for GOOS=wasip1 and is shared by the Envoy filter, the fleet
// simulator and the benchmarks: the strategy measured is the strategy shipped.
package scorer
