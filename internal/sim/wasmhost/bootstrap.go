package wasmhost

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"

	"github.com/kvroute/kvroute/internal/deploy/manifests"
)

// ConfigFromBootstrap turns one listener of a standalone Envoy bootstrap
// into the configuration of this host, so a
// shipped bootstrap can run with the real module on loopback: the Wasm
// filters in chain order with their root ids, configurations and
// allow_on_headers_stop_iteration, the headers a header_mutation filter
// before them removes, the vm_id, every STATIC cluster, the
// route's cluster, the header its override_host (or ORIGINAL_DST) reads, the
// failure policy, the connection buffer limit, the timeouts, and the VM's
// environment (host_env_keys are read from this process's environment, as
// Envoy reads its own).
//
// remap, when non-nil, rewrites each endpoint address ("10.0.0.11:8000")
// in the clusters and, textually, in the plugin configurations: it points
// the shipped addresses at test upstreams without editing the manifest.
func ConfigFromBootstrap(b *bootstrapv3.Bootstrap, listener string, remap map[string]string) (Config, error) {
	var cfg Config
	var lis *listenerv3.Listener
	for _, l := range b.GetStaticResources().GetListeners() {
		if l.GetName() == listener {
			lis = l
		}
	}
	if lis == nil {
		return cfg, fmt.Errorf("no listener %q", listener)
	}
	hcm, err := onlyHCM(lis)
	if err != nil {
		return cfg, fmt.Errorf("listener %s: %w", listener, err)
	}
	cfg.BufferLimitBytes = int(lis.GetPerConnectionBufferLimitBytes().GetValue())
	if d := hcm.GetStreamIdleTimeout(); d != nil {
		cfg.StreamIdleTimeout = d.AsDuration()
	}

	// The Wasm filters, in order, and the headers a header_mutation filter
	// before them removes.
	vmIDs := map[string]bool{}
	for _, f := range hcm.GetHttpFilters() {
		if hm := (&headermutationv3.HeaderMutation{}); f.GetTypedConfig().MessageIs(hm) && len(cfg.Filters) == 0 {
			if err := f.GetTypedConfig().UnmarshalTo(hm); err != nil {
				return cfg, err
			}
			for _, m := range hm.GetMutations().GetRequestMutations() {
				if r := m.GetRemove(); r != "" {
					cfg.RemoveRequestHeaders = append(cfg.RemoveRequestHeaders, r)
				}
			}
			continue
		}
		w := &wasmfilterv3.Wasm{}
		if !f.GetTypedConfig().MessageIs(w) {
			continue
		}
		if err := f.GetTypedConfig().UnmarshalTo(w); err != nil {
			return cfg, err
		}
		pc := w.GetConfig()
		conf, err := manifests.PluginConfiguration(pc.GetConfiguration())
		if err != nil {
			return cfg, fmt.Errorf("filter %s: %w", f.GetName(), err)
		}
		text := string(conf)
		for from, to := range remap {
			text = strings.ReplaceAll(text, from, to)
		}
		cfg.Filters = append(cfg.Filters, Filter{
			Name:                        pc.GetName(),
			RootID:                      pc.GetRootId(),
			Configuration:               text,
			AllowOnHeadersStopIteration: pc.GetAllowOnHeadersStopIteration().GetValue(),
		})
		vmIDs[pc.GetVmConfig().GetVmId()] = true
		// The VM's environment as Envoy builds it: host_env_keys read from
		// this process's environment, key_values as given.
		if ev := pc.GetVmConfig().GetEnvironmentVariables(); ev != nil {
			if cfg.Env == nil {
				cfg.Env = map[string]string{}
			}
			for _, k := range ev.GetHostEnvKeys() {
				if v, ok := os.LookupEnv(k); ok {
					cfg.Env[k] = v
				}
			}
			for k, v := range ev.GetKeyValues() {
				cfg.Env[k] = v
			}
		}
		cfg.FailOpen = pc.GetFailurePolicy() == wasmv3.FailurePolicy_FAIL_OPEN || pc.GetFailOpen()
	}
	if len(vmIDs) > 1 {
		return cfg, fmt.Errorf("listener %s: filters in several VMs %v; the test host runs one", listener, mapKeys(vmIDs))
	}
	for id := range vmIDs {
		cfg.VMID = id
	}

	// The route's cluster and timeout: the first route that forwards.
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if ra := r.GetRoute(); ra != nil && cfg.RouteCluster == "" {
				cfg.RouteCluster = ra.GetCluster()
				if d := ra.GetTimeout(); d != nil {
					cfg.RouteTimeout = d.AsDuration()
					if cfg.RouteTimeout == 0 {
						cfg.RouteTimeout = -1 // 0s disables Envoy's route timeout
					}
				}
			}
		}
	}

	cfg.Clusters = map[string][]string{}
	for _, c := range b.GetStaticResources().GetClusters() {
		var addrs []string
		for _, le := range c.GetLoadAssignment().GetEndpoints() {
			for _, lb := range le.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				a := fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())
				if to, ok := remap[a]; ok {
					a = to
				}
				addrs = append(addrs, a)
			}
		}
		cfg.Clusters[c.GetName()] = addrs
		if c.GetName() != cfg.RouteCluster {
			continue
		}
		header, origDst, err := hostHeader(c)
		if err != nil {
			return cfg, fmt.Errorf("cluster %s: %w", c.GetName(), err)
		}
		cfg.DestinationHeader, cfg.OriginalDst = header, origDst
	}
	if cfg.RouteCluster != "" {
		if _, ok := cfg.Clusters[cfg.RouteCluster]; !ok {
			return cfg, fmt.Errorf("route cluster %q is not defined", cfg.RouteCluster)
		}
	}
	return cfg, nil
}

func onlyHCM(l *listenerv3.Listener) (*hcmv3.HttpConnectionManager, error) {
	var found []*hcmv3.HttpConnectionManager
	for _, fc := range append([]*listenerv3.FilterChain{l.GetDefaultFilterChain()}, l.GetFilterChains()...) {
		for _, f := range fc.GetFilters() {
			h := &hcmv3.HttpConnectionManager{}
			if f.GetTypedConfig().MessageIs(h) {
				if err := f.GetTypedConfig().UnmarshalTo(h); err != nil {
					return nil, err
				}
				found = append(found, h)
			}
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("%d HTTP connection managers; the test host runs exactly one", len(found))
	}
	return found[0], nil
}

// hostHeader returns the header a cluster takes its host from.
func hostHeader(c *clusterv3.Cluster) (string, bool, error) {
	h, origDst, err := manifests.ClusterHostHeader(c)
	if err == nil && h == "" {
		err = errors.New("neither override_host with a header source nor ORIGINAL_DST with use_http_header")
	}
	return h, origDst, err
}

func mapKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
