// Package discovery finds the engines the metrics service scrapes.
//
// A Source produces the full endpoint set, once at start and again each
// time it changes; the service diffs successive sets, starting scrapers for
// new engines and stopping them for gone ones. Three sources exist: a static
// YAML file (re-read when it changes), the A/AAAA records of a DNS name (a
// Kubernetes headless Service) re-resolved periodically, and Kubernetes
// EndpointSlices watched through client-go with each pod's role and model
// read from its labels. A source that fails to refresh keeps its last good
// set: losing the view of the fleet must not empty the gateways.
package discovery

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/snapshot"
)

// Endpoint is one engine replica.
type Endpoint struct {
	// Address is host:port of the engine's HTTP server, as the gateway's
	// override_host policy sees it.
	Address string `json:"address"`
	// Role is snapshot.RolePrefill, RoleDecode or RoleBoth (empty means both).
	Role  string `json:"role,omitempty"`
	Model string `json:"model,omitempty"`
	// Adapters are LoRA adapters known to be served (added to those the
	// engine reports as running).
	Adapters []string `json:"adapters,omitempty"`
	// KVEvents is the engine's KV event publisher (tcp://host:port); empty
	// when its events are not followed.
	KVEvents string `json:"kvEvents,omitempty"`
	// KVEventsReplay is the engine's KV event replay socket
	// (tcp://host:port), asked for the batches of a sequence gap; empty
	// when gaps are only counted.
	KVEventsReplay string `json:"kvEventsReplay,omitempty"`
}

// Source produces the current endpoint set.
type Source interface {
	// Run calls update with the full set at start and whenever it changes,
	// until ctx is done. update is never called concurrently.
	Run(ctx context.Context, update func([]Endpoint)) error
	// Name says which kind of source this is, for logs and metrics.
	Name() string
}

// Validate checks an endpoint and fills defaults.
func (e *Endpoint) Validate() error {
	host, port, err := net.SplitHostPort(e.Address)
	if err != nil || host == "" {
		return fmt.Errorf("endpoint address %q: want host:port (e.g. 10.0.0.7:8000)", e.Address)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return fmt.Errorf("endpoint address %q: port must be 1..65535", e.Address)
	}
	role, err := snapshot.CheckRole(e.Role)
	if err != nil {
		return fmt.Errorf("endpoint %s: %v", e.Address, err)
	}
	e.Role = role
	if e.KVEvents != "" && !strings.HasPrefix(e.KVEvents, "tcp://") && !strings.HasPrefix(e.KVEvents, "ipc://") {
		return fmt.Errorf("endpoint %s: kvEvents %q: want tcp://host:port (the engine's --kv-events-config endpoint)", e.Address, e.KVEvents)
	}
	if e.KVEventsReplay != "" {
		if e.KVEvents == "" {
			return fmt.Errorf("endpoint %s: kvEventsReplay without kvEvents", e.Address)
		}
		if !strings.HasPrefix(e.KVEventsReplay, "tcp://") && !strings.HasPrefix(e.KVEventsReplay, "ipc://") {
			return fmt.Errorf("endpoint %s: kvEventsReplay %q: want tcp://host:port (the engine's --kv-events-config replay_endpoint)", e.Address, e.KVEventsReplay)
		}
	}
	return nil
}

// Equal reports whether two endpoint sets are the same, ignoring order.
func Equal(a, b []Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	a, b = sorted(a), sorted(b)
	for i := range a {
		if a[i].Address != b[i].Address || a[i].Role != b[i].Role || a[i].Model != b[i].Model ||
			a[i].KVEvents != b[i].KVEvents || a[i].KVEventsReplay != b[i].KVEventsReplay ||
			!slices.Equal(a[i].Adapters, b[i].Adapters) {
			return false
		}
	}
	return true
}

func sorted(eps []Endpoint) []Endpoint {
	out := slices.Clone(eps)
	slices.SortFunc(out, func(x, y Endpoint) int { return strings.Compare(x.Address, y.Address) })
	return out
}

// kvEventsFor builds the KV event endpoint for an IP when a port is set.
func kvEventsFor(ip string, port int) string {
	if port <= 0 {
		return ""
	}
	return "tcp://" + net.JoinHostPort(ip, strconv.Itoa(port))
}
