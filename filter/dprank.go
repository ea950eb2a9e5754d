package filter

import (
	"strconv"
	"strings"

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
// A rank has at most two digits (snapshot.MaxDataParallelSize), so only the
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

// prefillLocation is the value of PrefillHostHeader for the prefill
// location loc: host:port, or, for a data-parallel rank,
// host:port|rank/size, the endpoint's rank count included because SGLang's
// prefill and decode each derive the prefill's rank from the bootstrap room
// (room % size), so kvroute.pd picks a room that names the rank.
func (p *routerPlugin) prefillLocation(loc string) string {
	addr, rank := splitRank(loc)
	if rank == "" {
		return loc
	}
	size := 0
	for i := range p.hosts {
		if a, r := splitRank(p.hosts[i].Address); r != "" && a == addr {
			size++
		}
	}
	return loc + "/" + strconv.Itoa(size)
}

// prefillTarget reads PrefillHostHeader's value: the prefill hosts in retry
// order, each host:port or host:port|rank/size (prefillLocation). It
// returns the host list for the destination header (ranks removed) and the
// first host's rank and rank count ("" and 0 without one).
func prefillTarget(v string) (hosts, rank string, size int) {
	b := make([]byte, 0, len(v))
	for i, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		addr, r, _ := strings.Cut(item, "|")
		if i > 0 {
			b = append(b, ',')
		} else if r != "" {
			rs, ns, _ := strings.Cut(r, "/")
			n, err := strconv.Atoi(rs)
			m, merr := strconv.Atoi(ns)
			if err == nil && merr == nil && n >= 0 && n < m {
				rank, size = rs, m
			}
		}
		b = append(b, addr...)
	}
	return string(b), rank, size
}
