package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"time"
)

// Resolver is the part of *net.Resolver DNS discovery uses.
type Resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
}

// DNS discovers engines as the A and AAAA records of one name, typically a
// Kubernetes headless Service (my-vllm.ns.svc.cluster.local) in Host, each address
// paired with Port. The name is re-resolved every Refresh. All engines
// found share Role and Model: use one name per role.
type DNS struct {
	Host         string
	Port         int
	Role, Model  string
	KVEventsPort int // 0: do not follow KV events
	// KVEventsReplayPort is the engines' replay socket port (0: none).
	KVEventsReplayPort int
	Refresh            time.Duration // default 5 s
	Resolver           Resolver      // default net.DefaultResolver
	Log                *slog.Logger
}

// Name implements Source.
func (d *DNS) Name() string { return "dns" }

// Resolve looks the name up once and returns the endpoint set, sorted.
// A name that does not exist is an empty set (a headless Service with no
// ready pods has no records); other failures are errors.
func (d *DNS) Resolve(ctx context.Context) ([]Endpoint, error) {
	r := d.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := r.LookupIPAddr(ctx, d.Host)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return nil, nil
		}
		return nil, fmt.Errorf("resolve %s: %w", d.Host, err)
	}
	var eps []Endpoint
	for _, a := range addrs {
		ip := a.IP.String()
		if a.Zone != "" {
			ip += "%" + a.Zone
		}
		e := Endpoint{
			Address:  net.JoinHostPort(ip, strconv.Itoa(d.Port)),
			Role:     d.Role,
			Model:    d.Model,
			KVEvents: kvEventsFor(ip, d.KVEventsPort),
		}
		if e.KVEvents != "" {
			e.KVEventsReplay = kvEventsFor(ip, d.KVEventsReplayPort)
		}
		if err := e.Validate(); err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(eps, func(x Endpoint) bool { return x.Address == e.Address }) {
			eps = append(eps, e)
		}
	}
	return sorted(eps), nil
}

// Run implements Source. The first resolution must succeed.
func (d *DNS) Run(ctx context.Context, update func([]Endpoint)) error {
	if d.Port <= 0 || d.Port > 65535 {
		return fmt.Errorf("dns discovery of %q: a port 1..65535 is required", d.Host)
	}
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	refresh := d.Refresh
	if refresh <= 0 {
		refresh = 5 * time.Second
	}
	eps, err := d.Resolve(ctx)
	if err != nil {
		return err
	}
	update(eps)
	t := time.NewTicker(refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		next, err := d.Resolve(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			log.Warn("DNS refresh failed; keeping the previous endpoints", "name", d.Host, "err", err)
			continue
		}
		if !Equal(next, eps) {
			log.Info("DNS endpoints changed", "name", d.Host, "before", len(eps), "after", len(next))
			eps = next
			update(eps)
		}
	}
}
