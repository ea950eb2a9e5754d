// Package snapshot defines the cluster state that `kvroute metrics` pushes to
// every gateway's state endpoint (POST /.kvroute/v1/state by default).
//
// It is the one wire contract between the cluster-metrics service and the
// router filter, so it lives in its own package that imports no other
// package of kvroute's (gjson only): the service marshals it with
// encoding/json, the filter (inside Wasm) decodes it.
// Field names are camelCase like the plugin configuration. Add fields; never
// rename or repurpose one, since gateways and the service roll out separately.
package snapshot

import (
	"strconv"
	"strings"
)

import "fmt"

// Version is the snapshot format version carried in State.Version.
const Version = 1

// The roles an engine serves, as the snapshot (Host.Role), the plugin
// configuration (endpoints[].role), discovery and the simulated engines
// spell them. An empty role means RoleBoth.
const (
	// RoleBoth is an aggregated engine: it prefills and decodes.
	RoleBoth = "both"
	// RolePrefill engines compute prompts and hand the KV cache over.
	RolePrefill = "prefill"
	// RoleDecode engines receive transferred KV cache and generate.
	RoleDecode = "decode"
)

// CheckRole returns the role s names, RoleBoth for "", or an error that
// lists the roles.
func CheckRole(s string) (string, error) {
	switch s {
	case "":
		return RoleBoth, nil
	case RoleBoth, RolePrefill, RoleDecode:
		return s, nil
	}
	return RoleBoth, fmt.Errorf("%q is not a role: use %q, %q or %q", s, RolePrefill, RoleDecode, RoleBoth)
}

// State is one full picture of the fleet. A push replaces the previous
// picture: hosts absent from Hosts are no longer candidates.
type State struct {
	Version int `json:"version"`
	// TimestampMs is when the service assembled the snapshot (Unix ms).
	// The gateway compares it with its own clock to decide staleness.
	TimestampMs int64 `json:"timestampMs"`
	// Source names the pushing service instance, for logs.
	Source string `json:"source,omitempty"`
	Hosts  []Host `json:"hosts"`
	// Gateways are the gateways' routing reports the service received
	// since its previous push, and each gateway's latest load picture
	// (docs/topology.md). Absent with one gateway or without reports.
	Gateways []GatewayReport `json:"gateways,omitempty"`
	// Removals are the engines' evictions (KV events' BlockRemoved) the
	// service bridged into kvroute's hash space since its previous push
	// (docs/cache-state.md): each truncates one host's chain. A gateway
	// applies every removal it receives, from a push refused as older too;
	// a removal applied twice changes nothing, so two service replicas need
	// no coordination. A gateway that does not read this field keeps its
	// approximate cache state. Absent when there is none.
	Removals []Removal `json:"removals,omitempty"`
	// Cursor is set in the service's answer to a pulling gateway (GET
	// /state, state.pull): where, in the service's log of the routes and
	// removals it pushed, this answer ends. The gateway keeps it with the
	// state and asks /state?since=<cursor> next, and the answer carries
	// the routes and removals pushed since then, not only the last push's
	// (docs/cache-state.md). Opaque to the gateway; at most 64 characters
	// of [0-9A-Za-z._-].
	Cursor string `json:"cursor,omitempty"`
}

// Removal says Address no longer holds the blocks of a chain from block
// From on. Chain is the chain from its first block up to the last block
// removed (8-byte little-endian hashes, base64, std encoding, as in
// Route): a block's shard and weight depend on its position, and the
// blocks before From say which chain is cut. From < the chain's length.
type Removal struct {
	Address string `json:"address"`
	From    int    `json:"from"`
	Chain   string `json:"chain"`
	// Hashes is Chain decoded, which Decode sets when it checks Chain: a
	// gateway applies these and decodes no chain twice. Not on the wire:
	// an encoder sets Chain.
	Hashes []uint64 `json:"-"`
}

// Location names a cache location in routes and removals: an endpoint's
// host:port, or host:port|rank for one data-parallel rank of an endpoint
// that serves several (Host.DataParallelSize > 1; '|' never occurs in
// host:port).
func Location(address string, rank, dataParallelSize int) string {
	if dataParallelSize <= 1 {
		return address
	}
	return address + "|" + strconv.Itoa(rank)
}

// SplitLocation splits a Location into the endpoint's host:port and its
// rank (-1 for an endpoint without ranks, or a rank that is not a number).
func SplitLocation(loc string) (address string, rank int) {
	i := strings.LastIndexByte(loc, '|')
	if i < 0 {
		return loc, -1
	}
	r, err := strconv.Atoi(loc[i+1:])
	if err != nil || r < 0 {
		return loc[:i], -1
	}
	return loc[:i], r
}

// Host is one engine replica as last scraped.
type Host struct {
	// Address is host:port as Envoy's override_host policy sees it.
	Address string `json:"address"`
	// Role is RolePrefill, RoleDecode or RoleBoth (the default when empty).
	Role string `json:"role,omitempty"`
	// Model is the served base model name.
	Model string `json:"model,omitempty"`
	// Adapters lists LoRA adapters loaded or about to be: those with
	// requests running or waiting (vllm:lora_requests_info), plus those
	// discovery declares.
	Adapters []string `json:"adapters,omitempty"`
	// MaxAdapters is how many adapters the engine batches at once (vLLM's
	// max_lora; 0: unknown) and AdapterSlotsUsed how many it holds now; a
	// host with AdapterSlotsUsed >= MaxAdapters is full: a request for an
	// adapter it does not hold waits there until one drains.
	MaxAdapters      int `json:"maxAdapters,omitempty"`
	AdapterSlotsUsed int `json:"adapterSlotsUsed,omitempty"`
	// Healthy is false when the engine stopped answering scrapes.
	Healthy bool `json:"healthy"`
	// Waiting and Running are the engine's queue: vllm:num_requests_waiting,
	// vllm:num_requests_running (sglang:num_queue_reqs, sglang:num_running_reqs).
	Waiting int `json:"waiting"`
	Running int `json:"running"`
	// KVUsage is the fraction of KV blocks in use, 0..1
	// (vllm:kv_cache_usage_perc, sglang:token_usage).
	KVUsage float64 `json:"kvUsage"`
	// BlockSize (tokens per KV block) and NumGPUBlocks come from
	// vllm:cache_config_info; their product is the engine's KV capacity in tokens.
	BlockSize    int `json:"blockSize,omitempty"`
	NumGPUBlocks int `json:"numGpuBlocks,omitempty"`
	// CachedBlocks is the number of blocks the engine reported stored and not
	// removed through KV events (0 when KV events are not subscribed).
	CachedBlocks int `json:"cachedBlocks,omitempty"`
	// ClearedAtMs is the last time (Unix ms) the engine reported
	// AllBlocksCleared; the gateway forgets that host's blocks recorded before it.
	ClearedAtMs int64 `json:"clearedAtMs,omitempty"`
	// PreciseCacheState says the service bridges this host's KV events
	// into removals it can be trusted with (docs/cache-state.md): the
	// event stream is up, no events were lost lately, and nearly every
	// block the engine stored was matched to a route the gateways
	// reported. While a fresh push says so, a gateway lets the removals
	// age the host's blocks out and keeps its own eviction model (the KV
	// capacity) only as a backstop at twice the capacity; without it, or
	// once the pushed state is stale, the capacity model applies.
	PreciseCacheState bool `json:"preciseCacheState,omitempty"`
	// ScrapedAtMs is when this host was last scraped successfully (Unix ms).
	ScrapedAtMs int64 `json:"scrapedAtMs,omitempty"`
	// DataParallelSize is how many data-parallel ranks the endpoint serves,
	// each with its own KV cache (0 or 1: one). With more than one, this
	// Host is the endpoint's rank Rank: one entry per rank, each with that
	// rank's queue and cache facts (vLLM labels them engine="<rank>").
	DataParallelSize int `json:"dataParallelSize,omitempty"`
	Rank             int `json:"rank,omitempty"`
}

// GatewayReport is one gateway's routing since its previous report: what
// one of its workers (the holder of the gateway's report lease) POSTs to
// the metrics service once per interval, and what the service
// pushes on, merged, to every gateway in State.Gateways (docs/topology.md).
// A gateway applies the reports of the other gateways: each route marks its
// chain as held by its host, and the load counts are that gateway's
// outstanding work per host. Applying a report twice changes nothing, so
// two service replicas that each push everything need no coordination.
type GatewayReport struct {
	// Gateway identifies the reporting gateway (every worker of one Envoy
	// reports the same id, kept in its shared data); a gateway skips its
	// own reports.
	Gateway string `json:"gateway"`
	// TimestampMs is when the report was made (Unix ms); of two load
	// pictures of one gateway the newer wins.
	TimestampMs int64 `json:"timestampMs"`
	// Seq numbers the gateway's reports in increasing order (0: not
	// numbered). A service takes one gateway's report of one Seq once, so
	// a POST retried after a lost answer adds nothing.
	Seq uint64 `json:"seq,omitempty"`
	// Routes are the gateway's routing decisions since its last report,
	// every worker's.
	Routes []Route `json:"routes,omitempty"`
	// Load is the gateway's own outstanding work per host (its shared-data
	// counters when the report was made).
	Load []HostLoad `json:"load,omitempty"`
}

// Route is one routing decision as a block-hash chain delta: Address now
// holds the request's chain from block From on. Chain is the hashes
// chain[From:], 8 bytes each, little-endian, base64 (std encoding); From
// is a multiple of the index's segment length, so a receiver can place
// the blocks in its own shards without the blocks before From (which the
// host already held). Engines' KV events (precise cache state) can travel
// in the same shape.
type Route struct {
	Address string `json:"address"`
	From    int    `json:"from,omitempty"`
	Chain   string `json:"chain"`
	// Hashes is Chain decoded (the hashes of blocks From on), which
	// Decode sets when it checks Chain: a gateway applies these and
	// decodes no chain twice. Not on the wire: an encoder sets Chain.
	Hashes []uint64 `json:"-"`
	// PromptTokens is the request's prompt length as the gateway
	// estimated it: what the service's bridge between engine KV events and
	// kvroute chains correlates by (docs/cache-state.md).
	PromptTokens int `json:"promptTokens,omitempty"`
	// CharsPerToken is the gateway's calibrated characters per token for
	// the request's model (the engines' usage.prompt_tokens against the
	// prompts' canonical length), absent until calibrated: the service's
	// bridge converts engine tokens to kvroute characters with it.
	CharsPerToken float64 `json:"charsPerToken,omitempty"`
}

// HostLoad is one gateway's outstanding work on one host.
type HostLoad struct {
	Address       string `json:"address"`
	InFlight      int    `json:"inFlight"`
	PrefillTokens int64  `json:"prefillTokens"`
	DecodeTokens  int64  `json:"decodeTokens"`
}
