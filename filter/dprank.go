package filter

import (
	"strconv"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
)

// rankLocation is the candidate address of an endpoint's data-parallel
// rank: "host:port|rank". Each rank is a cache location of its own (its own
// index slot, prefix bits, load and breaker); '|' never occurs in host:port,
// so the destination header gets the endpoint back with splitRank.
func rankLocation(addr string, rank int) string {
	return addr + "|" + strconv.Itoa(rank)
}

// splitRank splits a candidate address into the endpoint's host:port and
// its data-parallel rank ("" for an endpoint without ranks).
// A rank has at most two digits (config.MaxDataParallelSize), so only the
// last three bytes are looked at: inlined, no call on the request path.
func splitRank(location string) (addr, rank string) {
	for i := len(location) - 1; i >= 0 && i >= len(location)-3; i-- {
		if location[i] == '|' {
			return location[:i], location[i+1:]
		}
	}
	return location, ""
}

// setRankHeader names the chosen data-parallel rank to the engine. Out of
// route's line (noinline): most endpoints have no ranks, and each function
// entered costs a request (docs/performance.md).
//
//go:noinline
func setRankHeader(rank string) {
	_ = proxywasm.ReplaceHttpRequestHeader(DataParallelRankHeader, rank)
}
