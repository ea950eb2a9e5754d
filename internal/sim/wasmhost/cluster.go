package wasmhost

import (
	"math/rand/v2"
	"net"
	"strings"
	"sync/atomic"
)

// cluster is a named list of upstream addresses ("host:port"), like an Envoy
// STATIC cluster whose endpoints are all healthy.
type cluster struct {
	name   string
	hosts  []*upstreamHost
	byAddr map[string]*upstreamHost
}

// upstreamHost counts its in-flight requests for the least-request fallback
// and the requests it received, for tests.
type upstreamHost struct {
	addr     string
	active   atomic.Int64
	requests atomic.Int64
}

func newCluster(name string, addrs []string) *cluster {
	c := &cluster{name: name, byAddr: map[string]*upstreamHost{}}
	for _, a := range addrs {
		a = strings.TrimSpace(a)
		if _, dup := c.byAddr[a]; dup || a == "" {
			continue
		}
		h := &upstreamHost{addr: a}
		c.hosts = append(c.hosts, h)
		c.byAddr[a] = h
	}
	return c
}

// overrideHosts parses a destination header the way Envoy's
// envoy.load_balancing_policies.override_host policy does: a comma-separated
// list of IP:port, tried in order. Addresses that are not endpoints of the
// cluster (or not IP:port) are skipped; duplicates are tried once.
func (c *cluster) overrideHosts(value string) []*upstreamHost {
	var out []*upstreamHost
	for _, a := range strings.Split(value, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		h := c.byAddr[a]
		if h == nil {
			continue
		}
		dup := false
		for _, o := range out {
			dup = dup || o == h
		}
		if !dup {
			out = append(out, h)
		}
	}
	return out
}

// leastRequest is Envoy's LEAST_REQUEST load balancer with equal weights:
// the better of two random choices (choice_count 2), ties to the first draw.
// Hosts in exclude are not picked while others remain.
func (c *cluster) leastRequest(exclude []*upstreamHost) *upstreamHost {
	cand := c.hosts
	if len(exclude) > 0 {
		cand = make([]*upstreamHost, 0, len(c.hosts))
		for _, h := range c.hosts {
			skip := false
			for _, e := range exclude {
				skip = skip || e == h
			}
			if !skip {
				cand = append(cand, h)
			}
		}
	}
	switch len(cand) {
	case 0:
		return nil
	case 1:
		return cand[0]
	}
	a := cand[rand.IntN(len(cand))]
	b := cand[rand.IntN(len(cand))]
	if b.active.Load() < a.active.Load() {
		return b
	}
	return a
}

// originalDst parses the single address an ORIGINAL_DST cluster with
// use_http_header takes from the destination header. It must be IP:port.
func originalDst(value string) (string, bool) {
	value = strings.TrimSpace(value)
	host, port, err := net.SplitHostPort(value)
	if err != nil || port == "" || net.ParseIP(host) == nil {
		return "", false
	}
	return value, true
}
