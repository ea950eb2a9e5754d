// Package envoy_test checks every manifest under envoy/ against the real API
// types (see internal/manifests), the plugin configuration embedded in each
// against the filter's own validator (filter/config), and the cross-file
// facts kvroute depends on: the header the filter writes is the header the
// cluster reads, the buffer limit exceeds the largest body the filter
// accepts, both filters share one VM, body routing has the setting it needs.
package envoy_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	istionet "istio.io/api/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/kvroute/kvroute/filter/config"
	"github.com/kvroute/kvroute/internal/manifests"
)

// shipped lists every manifest; a new file must be added here, so nothing
// ships unchecked by accident (TestNoUncheckedManifests).
var shipped = []string{
	"standalone/envoy.yaml",
	"standalone/envoy-original-dst.yaml",
	"istio/envoyfilter.yaml",
	"istio/wasmplugin-header-only.yaml",
	"envoy-gateway/kvroute.yaml",
	"kubernetes/metrics.yaml",
}

func read(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestNoUncheckedManifests(t *testing.T) {
	var found []string
	err := filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml") || strings.HasSuffix(p, ".json")) {
			found = append(found, filepath.ToSlash(p))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := append([]string(nil), shipped...)
	sort.Strings(found)
	sort.Strings(want)
	if strings.Join(found, ",") != strings.Join(want, ",") {
		t.Fatalf("manifests on disk %v differ from the checked list %v: add new files to `shipped`", found, want)
	}
}

// TestManifests decodes every manifest strictly and runs the kvroute checks.
func TestManifests(t *testing.T) {
	for _, name := range shipped {
		t.Run(name, func(t *testing.T) {
			res, err := manifests.Check(name, read(t, name))
			if err != nil {
				t.Fatal(err)
			}
			if err := checkKvroute(res); err != nil {
				t.Fatal(err)
			}
			if name != "kubernetes/metrics.yaml" && len(res.Plugins) == 0 {
				t.Fatal("no kvroute plugin configuration found")
			}
		})
	}
}

// checkKvroute holds what kvroute needs of any manifest, beyond API validity.
func checkKvroute(res *manifests.Result) error {
	if err := checkKubernetesRefs(res); err != nil {
		return err
	}
	vmIDs := map[string]bool{}
	var cfgs []*config.Config
	for _, p := range res.Plugins {
		if p.RootID != "kvroute.router" && p.RootID != "kvroute.pd" {
			return fmt.Errorf("%s: root id %q: want kvroute.router or kvroute.pd", p.Where, p.RootID)
		}
		cfg, err := config.Parse(p.Config)
		if err != nil {
			return fmt.Errorf("%s: plugin configuration: %w", p.Where, err)
		}
		cfgs = append(cfgs, cfg)
		if len(cfg.Warnings) > 0 {
			return fmt.Errorf("%s: the strategy configuration draws warnings: %v", p.Where, cfg.Warnings)
		}
		if cfg.BodyRouting && (p.AllowOnHeadersStopIteration == nil || !*p.AllowOnHeadersStopIteration) {
			return fmt.Errorf("%s: bodyRouting is on but allow_on_headers_stop_iteration is not true: Envoy would pick the host before the filter sees the body", p.Where)
		}
		if p.RootID == "kvroute.pd" && !cfg.BodyRouting {
			return fmt.Errorf("%s: kvroute.pd needs bodyRouting", p.Where)
		}
		if cfg.State.Token != "" {
			return fmt.Errorf("%s: state.token puts the secret in the manifest: use state.tokenEnv and pass the variable to the VM", p.Where)
		}
		if cfg.State.TokenEnv == "" {
			return fmt.Errorf("%s: no state.tokenEnv: every push from kvroute metrics would get 401", p.Where)
		}
		if !contains(p.HostEnvKeys, cfg.State.TokenEnv) {
			return fmt.Errorf("%s: state.tokenEnv %s is not passed to the VM (vm_config.environment_variables.host_env_keys, WasmPlugin vmConfig.env, Envoy Gateway env.hostKeys): the VM would read it empty", p.Where, cfg.State.TokenEnv)
		}
		if p.AllowOnHeadersStopIteration != nil { // Envoy-level config we control
			vmIDs[p.VMID] = true
		}
	}
	if len(vmIDs) > 1 {
		return fmt.Errorf("%s: kvroute filters run in vm_ids %v: router, pd and the state endpoint must share one VM (shared data is per vm_id)", res.File, keys(vmIDs))
	}
	if len(vmIDs) == 1 && vmIDs[""] {
		return fmt.Errorf("%s: vm_id is empty", res.File)
	}
	for _, c := range cfgs[min(1, len(cfgs)):] {
		if c.DestinationHeader != cfgs[0].DestinationHeader {
			return fmt.Errorf("%s: plugins disagree on destinationHeader (%q, %q)", res.File, cfgs[0].DestinationHeader, c.DestinationHeader)
		}
	}
	if len(cfgs) == 0 {
		return nil
	}
	clusters := knownClusters(res)
	hasPD := false
	for _, p := range res.Plugins {
		hasPD = hasPD || p.RootID == "kvroute.pd"
	}
	for i, p := range res.Plugins {
		if !hasPD {
			break
		}
		for field, name := range map[string]string{"pd.prefillCluster": cfgs[i].PD.PrefillCluster, "pd.decodeCluster": cfgs[i].PD.DecodeCluster} {
			if !clusters[name] {
				return fmt.Errorf("%s: %s %q is not a cluster this file defines or patches (%v)", p.Where, field, name, keys(clusters))
			}
		}
	}
	return checkWiring(res, cfgs[0])
}

// knownClusters lists the Envoy clusters a file defines (standalone), sets
// the load balancing of (Istio CLUSTER patches: outbound|PORT||SERVICE), or
// makes Envoy Gateway generate or add (httproute/NS/NAME/rule/N, patches).
func knownClusters(res *manifests.Result) map[string]bool {
	out := map[string]bool{}
	for _, r := range res.Envoy {
		switch m := r.Message.(type) {
		case *bootstrapv3.Bootstrap:
			for _, c := range m.GetStaticResources().GetClusters() {
				out[c.GetName()] = true
			}
		case *clusterv3.Cluster:
			if !strings.HasPrefix(m.GetName(), "outbound|8000||base") {
				out[m.GetName()] = true
			}
		}
	}
	for _, o := range res.Objects {
		switch v := o.Value.(type) {
		case *manifests.IstioObject:
			if ef, ok := v.Spec.(*istionet.EnvoyFilter); ok {
				for _, cp := range ef.GetConfigPatches() {
					if c := cp.GetMatch().GetCluster(); c != nil && c.GetService() != "" {
						out[fmt.Sprintf("outbound|%d|%s|%s", c.GetPortNumber(), c.GetSubset(), c.GetService())] = true
					}
				}
			}
		case *gwapiv1.HTTPRoute:
			for i := range v.Spec.Rules {
				out[fmt.Sprintf("httproute/%s/%s/rule/%d", v.Namespace, v.Name, i)] = true
			}
		}
	}
	return out
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkWiring checks the Envoy side agrees with the plugin configuration.
func checkWiring(res *manifests.Result, cfg *config.Config) error {
	header := cfg.DestinationHeader
	var overrideHeaders []string
	var bufferLimits []uint32
	stripped := false // a filter or setting removes the client's header before kvroute
	for _, r := range res.Envoy {
		switch m := r.Message.(type) {
		case *hcmv3.HttpFilter:
			hm := &headermutationv3.HeaderMutation{}
			if m.GetTypedConfig().MessageIs(hm) && m.GetTypedConfig().UnmarshalTo(hm) == nil {
				for _, mu := range hm.GetMutations().GetRequestMutations() {
					stripped = stripped || mu.GetRemove() == header
				}
			}
		case *bootstrapv3.Bootstrap:
			stripped = true // checkListener requires it per listener
			for _, l := range m.GetStaticResources().GetListeners() {
				if err := checkListener(r.Where, l, header, cfg); err != nil {
					return err
				}
				if hasKvroute(l) && routesToCluster(l) {
					bufferLimits = append(bufferLimits, l.GetPerConnectionBufferLimitBytes().GetValue())
				}
			}
			for _, c := range m.GetStaticResources().GetClusters() {
				h, err := clusterHeader(c)
				if err != nil {
					return fmt.Errorf("%s: cluster %s: %w", r.Where, c.GetName(), err)
				}
				overrideHeaders = append(overrideHeaders, h)
				if c.GetType() == clusterv3.Cluster_ORIGINAL_DST && cfg.Fallbacks != 0 {
					return fmt.Errorf("%s: cluster %s is ORIGINAL_DST, which takes one address: set \"fallbacks\": 0", r.Where, c.GetName())
				}
				if c.GetType() == clusterv3.Cluster_STATIC {
					if err := checkEndpointsInCluster(c, cfg); err != nil {
						return fmt.Errorf("%s: %w", r.Where, err)
					}
				}
			}
		case *clusterv3.Cluster:
			h, err := clusterHeader(m)
			if err != nil {
				return fmt.Errorf("%s: %w", r.Where, err)
			}
			overrideHeaders = append(overrideHeaders, h)
		case *listenerv3.Listener:
			if m.GetPerConnectionBufferLimitBytes() != nil {
				bufferLimits = append(bufferLimits, m.GetPerConnectionBufferLimitBytes().GetValue())
			}
		}
	}
	for _, o := range res.Objects {
		switch v := o.Value.(type) {
		case *egv1a1.BackendTrafficPolicy:
			if eo := v.Spec.LoadBalancer.EndpointOverride; eo != nil {
				for _, ef := range eo.ExtractFrom {
					if ef.Header != nil {
						overrideHeaders = append(overrideHeaders, *ef.Header)
					}
				}
			}
		case *egv1a1.EnvoyProxy:
			var env []string
			if k := v.Spec.Provider; k != nil && k.Kubernetes != nil && k.Kubernetes.EnvoyDeployment != nil && k.Kubernetes.EnvoyDeployment.Container != nil {
				for _, e := range k.Kubernetes.EnvoyDeployment.Container.Env {
					env = append(env, e.Name)
				}
			}
			if cfg.State.TokenEnv != "" && !contains(env, cfg.State.TokenEnv) {
				return fmt.Errorf("%s: the Envoy container's env does not set %s, which the plugins read (state.tokenEnv)", o.Where, cfg.State.TokenEnv)
			}
		case *egv1a1.ClientTrafficPolicy:
			if c := v.Spec.Connection; c != nil && c.BufferLimit != nil {
				bufferLimits = append(bufferLimits, uint32(c.BufferLimit.Value()))
			}
			if h := v.Spec.Headers; h == nil || h.EarlyRequestHeaders == nil || !contains(h.EarlyRequestHeaders.Remove, header) {
				return fmt.Errorf("%s: headers.earlyRequestHeaders.remove must list %s so a client cannot steer the request", o.Where, header)
			}
			stripped = true
		}
	}
	if cfg.BodyRouting {
		if len(bufferLimits) == 0 {
			return fmt.Errorf("%s: no connection buffer limit is raised: bodies over 1 MiB would get 413 from Envoy", res.File)
		}
		for _, b := range bufferLimits {
			if int(b) < cfg.MaxBodyBytes {
				return fmt.Errorf("%s: connection buffer limit %d is below maxBodyBytes %d: Envoy would answer 413 before the filter decides", res.File, b, cfg.MaxBodyBytes)
			}
		}
	}
	if !stripped {
		return fmt.Errorf("%s: nothing removes a client's %s before kvroute runs (header_mutation filter, earlyRequestHeaders): with the VM failed open a client would pick the replica", res.File, header)
	}
	for _, h := range overrideHeaders {
		if h != "" && h != header {
			return fmt.Errorf("%s: a cluster reads the host from %q but the filter writes %q", res.File, h, header)
		}
	}
	if len(overrideHeaders) == 0 {
		return fmt.Errorf("%s: no cluster reads %s (override_host or ORIGINAL_DST): the decision would be ignored", res.File, header)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func hcmOf(l *listenerv3.Listener) []*hcmv3.HttpConnectionManager {
	var out []*hcmv3.HttpConnectionManager
	chains := append([]*listenerv3.FilterChain{l.GetDefaultFilterChain()}, l.GetFilterChains()...)
	for _, fc := range chains {
		for _, f := range fc.GetFilters() {
			h := &hcmv3.HttpConnectionManager{}
			if f.GetTypedConfig().MessageIs(h) && f.GetTypedConfig().UnmarshalTo(h) == nil {
				out = append(out, h)
			}
		}
	}
	return out
}

func wasmOf(f *hcmv3.HttpFilter) *wasmv3.PluginConfig {
	w := &wasmfilterv3.Wasm{}
	if f.GetTypedConfig().MessageIs(w) && f.GetTypedConfig().UnmarshalTo(w) == nil {
		return w.GetConfig()
	}
	return nil
}

// routesToCluster reports whether a listener forwards requests (rather than
// only answering locally, as the state listener does).
func routesToCluster(l *listenerv3.Listener) bool {
	for _, h := range hcmOf(l) {
		for _, vh := range h.GetRouteConfig().GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				if r.GetRoute() != nil {
					return true
				}
			}
		}
	}
	return false
}

func hasKvroute(l *listenerv3.Listener) bool {
	for _, h := range hcmOf(l) {
		for _, f := range h.GetHttpFilters() {
			if wasmOf(f) != nil {
				return true
			}
		}
	}
	return false
}

// checkListener: the header is stripped before the Wasm filter, and a
// listener that routes inference has no request deadline.
func checkListener(where string, l *listenerv3.Listener, header string, cfg *config.Config) error {
	for _, h := range hcmOf(l) {
		stripped := false
		routing := false
		for _, f := range h.GetHttpFilters() {
			hm := &headermutationv3.HeaderMutation{}
			if f.GetTypedConfig().MessageIs(hm) && f.GetTypedConfig().UnmarshalTo(hm) == nil {
				for _, m := range hm.GetMutations().GetRequestMutations() {
					if m.GetRemove() == header {
						stripped = true
					}
				}
			}
			if pc := wasmOf(f); pc != nil && pc.GetRootId() == "kvroute.router" {
				for _, r := range h.GetRouteConfig().GetVirtualHosts() {
					for _, rt := range r.GetRoutes() {
						if rt.GetRoute() != nil {
							routing = true
							if d := rt.GetRoute().GetTimeout(); d == nil || d.AsDuration() != 0 {
								return fmt.Errorf("%s: listener %s: route timeout %v would cut long streamed generations: set timeout: 0s and an idle_timeout", where, l.GetName(), d.AsDuration())
							}
						}
					}
				}
				if routing && !stripped {
					return fmt.Errorf("%s: listener %s: %s is not removed (header_mutation) before kvroute.router", where, l.GetName(), header)
				}
			}
		}
	}
	return nil
}

// clusterHeader returns the header a cluster picks its host from, or "".
func clusterHeader(c *clusterv3.Cluster) (string, error) {
	if c.GetType() == clusterv3.Cluster_ORIGINAL_DST {
		if !c.GetOriginalDstLbConfig().GetUseHttpHeader() {
			return "", errors.New("ORIGINAL_DST without use_http_header ignores the filter")
		}
		return c.GetOriginalDstLbConfig().GetHttpHeaderName(), nil
	}
	for _, p := range c.GetLoadBalancingPolicy().GetPolicies() {
		oh := &overridehostv3.OverrideHost{}
		tc := p.GetTypedExtensionConfig().GetTypedConfig()
		if tc.MessageIs(oh) {
			if err := tc.UnmarshalTo(oh); err != nil {
				return "", err
			}
			if oh.GetFallbackPolicy() == nil {
				return "", errors.New("override_host needs a fallback_policy")
			}
			for _, s := range oh.GetOverrideHostSources() {
				if s.GetHeader() != "" {
					return s.GetHeader(), nil
				}
			}
		}
	}
	return "", nil
}

// checkEndpointsInCluster: every static endpoint the plugin may name must be
// in the cluster for its role, or override_host would skip it.
func checkEndpointsInCluster(c *clusterv3.Cluster, cfg *config.Config) error {
	have := map[string]bool{}
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			have[fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())] = true
		}
	}
	wantRole := config.RoleDecode
	if strings.Contains(c.GetName(), "prefill") {
		wantRole = config.RolePrefill
	}
	for _, e := range cfg.Endpoints {
		if e.Role == wantRole || (e.Role == config.RoleBoth && wantRole == config.RoleDecode) {
			if !have[e.Address] {
				return fmt.Errorf("cluster %s lacks endpoint %s (role %s) named in the plugin configuration", c.GetName(), e.Address, e.Role)
			}
		}
	}
	return nil
}

// TestBrokenManifestsNameTheField breaks each kind of manifest on purpose and
// checks the error names what is wrong.
func TestBrokenManifestsNameTheField(t *testing.T) {
	cases := []struct {
		file, old, new, want string
	}{
		// Unknown Envoy field.
		{"standalone/envoy.yaml", "per_connection_buffer_limit_bytes: 33554432", "per_connection_buffer_limits: 33554432", "per_connection_buffer_limits"},
		{"standalone/envoy.yaml", "allow_on_headers_stop_iteration: true", "allow_on_header_stop_iteration: true", "allow_on_header_stop_iteration"},
		// A typed_config type that does not exist.
		{"standalone/envoy.yaml", "override_host.v3.OverrideHost\n", "override_host.v3.OverideHost\n", "OverideHost"},
		// Valid shape, invalid value (protoc-gen-validate).
		{"standalone/envoy.yaml", "- name: kvroute_prefill\n    type: STATIC\n    connect_timeout: 2s", "- name: kvroute_prefill\n    type: STATIC\n    connect_timeout: -2s", "ConnectTimeout"},
		{"standalone/envoy.yaml", "port_value: 9002", "port_value: 99002", "PortValue"},
		// kvroute's own checks.
		{"standalone/envoy.yaml", "                    host_env_keys: [KVROUTE_STATE_TOKEN]\n", "", "host_env_keys"},
		{"istio/wasmplugin-header-only.yaml", "      valueFrom: HOST", "      valueFrom: INLINE", "tokenEnv"},
		{"envoy-gateway/kvroute.yaml", "        tokenEnv: KVROUTE_STATE_TOKEN", "        token: s3cr3t", "state.token"},
		{"envoy-gateway/kvroute.yaml", "          - name: KVROUTE_STATE_TOKEN\n            valueFrom:", "          - name: STATE_TOKEN\n            valueFrom:", "container's env"},
		{"standalone/envoy.yaml", "                allow_on_headers_stop_iteration: true\n                failure_policy: FAIL_OPEN\n                vm_config: *kvroute_vm", "                failure_policy: FAIL_OPEN\n                vm_config: *kvroute_vm", "allow_on_headers_stop_iteration"},
		{"standalone/envoy.yaml", "per_connection_buffer_limit_bytes: 33554432\n    filter_chains", "per_connection_buffer_limit_bytes: 1048576\n    filter_chains", "maxBodyBytes"},
		{"standalone/envoy.yaml", "- header: x-gateway-destination-endpoint\n            fallback_policy", "- header: x-destination\n            fallback_policy", "x-destination"},
		{"standalone/envoy.yaml", "endpoint: {address: {socket_address: {address: 10.0.0.12,", "endpoint: {address: {socket_address: {address: 10.0.0.13,", "10.0.0.12:8000"},
		{"standalone/envoy.yaml", "                - remove: x-gateway-destination-endpoint\n", "                - remove: x-other\n", "header_mutation"},
		{"standalone/envoy.yaml", "                  timeout: 0s\n", "                  timeout: 15s\n", "route timeout"},
		{"standalone/envoy-original-dst.yaml", `"fallbacks": 0,`, `"fallbacks": 2,`, "fallbacks"},
		// The plugin configuration, through the filter's validator.
		{"standalone/envoy.yaml", `"destinationHeader": "x-gateway-destination-endpoint"`, `"destinationHeadr": "x-gateway-destination-endpoint"`, "destinationHeadr"},
		{"istio/envoyfilter.yaml", `"strategy": "kv_cache_aware"`, `"strategy": "kv_cache_awesome"`, "strategy"},
		{"envoy-gateway/kvroute.yaml", "maxBodyBytes: 16777216", "maxBodyBytes: -1", "maxBodyBytes"},
		{"istio/envoyfilter.yaml", `"prefillCluster": "outbound|8000||vllm-prefill.llm.svc.cluster.local"`, `"prefillCluster": "outbound|8000||vllm-prefil.llm.svc.cluster.local"`, "pd.prefillCluster"},
		{"envoy-gateway/kvroute.yaml", "decodeCluster: httproute/llm/kvroute-inference/rule/0", "decodeCluster: httproute/llm/kvroute/rule/0", "pd.decodeCluster"},
		// Istio.
		{"istio/envoyfilter.yaml", "applyTo: LISTENER\n", "applyTo: LISTENERS\n", "applyTo"},
		{"istio/envoyfilter.yaml", "            - remove: x-gateway-destination-endpoint", "            - remove: x-other", "nothing removes"},
		{"istio/envoyfilter.yaml", "          type_urls:\n", "          type_url:\n", "type_url"},
		{"istio/envoyfilter.yaml", "initial_fetch_timeout: 0s", "initial_fetch_timeout: soon", "initial_fetch_timeout"},
		{"istio/envoyfilter.yaml", "                override_host_sources:", "                override_hosts_sources:", "override_hosts_sources"},
		{"istio/envoyfilter.yaml", "  workloadSelector:", "  workloadSelectors:", "workloadSelectors"},
		{"istio/wasmplugin-header-only.yaml", "pluginName: kvroute.router", "plugin_nam: kvroute.router", "plugin_nam"},
		{"istio/wasmplugin-header-only.yaml", "bodyRouting: false", "bodyRouting: true", "allow_on_headers_stop_iteration"},
		// Envoy Gateway.
		{"envoy-gateway/kvroute.yaml", "    endpointOverride:", "    endpointOverrides:", "endpointOverrides"},
		{"envoy-gateway/kvroute.yaml", "llm/kvroute/wasm/1')].typed_config.config\"", "llm/kvroute/wasm/7')].typed_config.config\"", "matches nothing"},
		{"envoy-gateway/kvroute.yaml", "    name: llm/kvroute/kvroute-state\n", "    name: llm/kvroute/state\n", "llm/kvroute/state"},
		{"envoy-gateway/kvroute.yaml", "      path: /vm_id\n      value: kvroute\n  # Listener llm/kvroute/kvroute-state", "      path: /vm_id\n      value: kvroute-pd\n  # Listener llm/kvroute/kvroute-state", "vm_id"},
		{"envoy-gateway/kvroute.yaml", "      remove: [x-gateway-destination-endpoint]", "      remove: [x-other]", "earlyRequestHeaders"},
		{"envoy-gateway/kvroute.yaml", "        type: STRICT_DNS", "        type: STRICTER_DNS", "STRICTER_DNS"},
		// Kubernetes.
		{"kubernetes/metrics.yaml", "      serviceAccountName: kvroute-metrics", "      serviceAccount_name: kvroute-metrics", "serviceAccount_name"},
		{"kubernetes/metrics.yaml", "  token: REPLACE-WITH-STATE-TOKEN", "  token: s3cr3t", "placeholder"},
		{"kubernetes/metrics.yaml", "          secretName: kvroute-state-token", "          secretName: kvroute-token", "kvroute-token"},
		{"kubernetes/metrics.yaml", "  resources: [\"endpointslices\"]", "  resources: [\"endpoints\"]", "endpointslices"},
		{"kubernetes/metrics.yaml", "          httpGet: {path: /healthz, port: http-metrics}\n          periodSeconds: 5", "          httpGet: {path: /healthz, port: metrics}\n          periodSeconds: 5", "probe port"},
		{"kubernetes/metrics.yaml", "  selector:\n    app.kubernetes.io/name: kvroute-metrics\n  ports:", "  selector:\n    app.kubernetes.io/name: kvroute-metric\n  ports:", "matches no pod"},
	}
	for _, c := range cases {
		t.Run(c.file+"/"+c.want, func(t *testing.T) {
			data := string(read(t, c.file))
			if strings.Count(data, c.old) < 1 {
				t.Fatalf("the test's anchor %q is not in %s any more: update the case", c.old, c.file)
			}
			broken := strings.Replace(data, c.old, c.new, 1)
			res, err := manifests.Check(c.file, []byte(broken))
			if err == nil {
				err = checkKvroute(res)
			}
			if err == nil {
				t.Fatalf("breaking %s (%q -> %q) was not detected", c.file, c.old, c.new)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error does not name %q:\n%v", c.want, err)
			}
		})
	}
}

// TestPluginConfigsAgree: the same deployment's router and pd plugins get the
// same configuration (they share a VM and its state).
func TestPluginConfigsAgree(t *testing.T) {
	for _, name := range shipped {
		res, err := manifests.Check(name, read(t, name))
		if err != nil {
			t.Fatal(err)
		}
		var first *config.Config
		for _, p := range res.Plugins {
			c, err := config.Parse(p.Config)
			if err != nil {
				t.Fatal(err)
			}
			if first == nil {
				first = c
				continue
			}
			// Endpoints and state are what the two filters must agree on.
			if fmt.Sprint(first.Endpoints) != fmt.Sprint(c.Endpoints) || first.State != c.State {
				t.Errorf("%s: %s has a configuration that differs from the first plugin's", name, p.Where)
			}
		}
	}
}

// TestWasmModuleStaysLight: the API modules these checks use (and the OCI
// library) must never reach the Wasm module, whose size and start time they
// would multiply.
func TestWasmModuleStaysLight(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	cmd := exec.Command("go", "list", "-deps", "./filter/module")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	out, err := cmd.CombinedOutput()
	if err != nil {
		// A dependency graph that does not resolve is what this test is
		// here to catch, so it fails rather than skips.
		t.Fatalf("cannot list the Wasm module's dependencies (GOOS=wasip1 GOARCH=wasm go list -deps ./filter/module): %v\n%s\nFix the import graph or go.mod (`go build ./filter/module` with the same GOOS/GOARCH shows the cause).", err, out)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/kvroute/kvroute/filter") {
		t.Fatalf("go list -deps ./filter/module does not list github.com/kvroute/kvroute/filter, so the check below would prove nothing:\n%s", out)
	}
	heavy := []string{"github.com/envoyproxy/", "istio.io/", "k8s.io/", "sigs.k8s.io/", "github.com/google/go-containerregistry", "google.golang.org/protobuf", "github.com/kvroute/kvroute/internal/manifests", "github.com/kvroute/kvroute/internal/oci"}
	for _, dep := range deps {
		for _, h := range heavy {
			if strings.HasPrefix(dep, h) {
				t.Errorf("the Wasm module depends on %s", dep)
			}
		}
	}
}

// checkKubernetesRefs: the references between the Kubernetes objects of one
// file resolve (what kubectl apply accepts but the pod would then fail on).
func checkKubernetesRefs(res *manifests.Result) error {
	has := map[string]bool{}
	for _, o := range res.Objects {
		has[o.Kind+"/"+o.Namespace+"/"+o.Name] = true
	}
	for _, o := range res.Objects {
		switch v := o.Value.(type) {
		case *appsv1.Deployment:
			sel, err := metav1.LabelSelectorAsSelector(v.Spec.Selector)
			if err != nil {
				return fmt.Errorf("%s: spec.selector: %w", o.Where, err)
			}
			podLabels := labels.Set(v.Spec.Template.Labels)
			if !sel.Matches(podLabels) {
				return fmt.Errorf("%s: spec.selector does not match the pod template's labels", o.Where)
			}
			pod := v.Spec.Template.Spec
			if sa := pod.ServiceAccountName; sa != "" && !has["ServiceAccount/"+v.Namespace+"/"+sa] {
				return fmt.Errorf("%s: serviceAccountName %q is not in this file", o.Where, sa)
			}
			for _, vol := range pod.Volumes {
				if vol.Secret != nil && !has["Secret/"+v.Namespace+"/"+vol.Secret.SecretName] {
					return fmt.Errorf("%s: volume %s: Secret %q is not in this file", o.Where, vol.Name, vol.Secret.SecretName)
				}
			}
			for _, c := range pod.Containers {
				ports := map[string]bool{}
				for _, p := range c.Ports {
					ports[p.Name] = true
				}
				for _, probe := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
					if probe != nil && probe.HTTPGet != nil && probe.HTTPGet.Port.StrVal != "" && !ports[probe.HTTPGet.Port.StrVal] {
						return fmt.Errorf("%s: container %s: probe port %q is not a named port", o.Where, c.Name, probe.HTTPGet.Port.StrVal)
					}
				}
				mounts := map[string]bool{}
				for _, vol := range pod.Volumes {
					mounts[vol.Name] = true
				}
				for _, m := range c.VolumeMounts {
					if !mounts[m.Name] {
						return fmt.Errorf("%s: container %s: volumeMount %q has no volume", o.Where, c.Name, m.Name)
					}
				}
			}
			// Every Service of the file that selects these pods.
			for _, o2 := range res.Objects {
				if svc, ok := o2.Value.(*corev1.Service); ok && svc.Namespace == v.Namespace {
					if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
						return fmt.Errorf("%s: spec.selector matches no pod of Deployment %s", o2.Where, v.Name)
					}
				}
			}
		case *rbacv1.RoleBinding:
			if !has[v.RoleRef.Kind+"/"+v.Namespace+"/"+v.RoleRef.Name] && !has[v.RoleRef.Kind+"//"+v.RoleRef.Name] {
				return fmt.Errorf("%s: roleRef %s %q is not in this file", o.Where, v.RoleRef.Kind, v.RoleRef.Name)
			}
			for _, sub := range v.Subjects {
				if sub.Kind == "ServiceAccount" && !has["ServiceAccount/"+sub.Namespace+"/"+sub.Name] {
					return fmt.Errorf("%s: subject ServiceAccount %s/%s is not in this file", o.Where, sub.Namespace, sub.Name)
				}
			}
		case *rbacv1.Role:
			if !grants(v.Rules, "discovery.k8s.io", "endpointslices", "list", "watch") {
				return fmt.Errorf("%s: rules do not grant list and watch on discovery.k8s.io endpointslices, which discovery needs", o.Where)
			}
		}
	}
	return nil
}

func grants(rules []rbacv1.PolicyRule, group, resource string, verbs ...string) bool {
	for _, r := range rules {
		if contains(r.APIGroups, group) && contains(r.Resources, resource) {
			ok := true
			for _, v := range verbs {
				ok = ok && (contains(r.Verbs, v) || contains(r.Verbs, "*"))
			}
			if ok {
				return true
			}
		}
	}
	return false
}
