package manifests

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
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

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/scorer"
	"github.com/kvroute/kvroute/snapshot"
)

// checkKvroute holds what kvroute needs of any manifest beyond API validity:
// each plugin configuration passes the filter's own parser (config),
// the header the filter writes is the header the cluster reads and is
// stripped from clients, the buffer limit exceeds the largest body the
// filter accepts, router and pd share one VM, body routing has the setting
// it needs, the state token comes from the environment, and the references
// between Kubernetes objects resolve. Nothing here depends on the shipped
// addresses or names: a correct edit passes.
func checkKvroute(r *report, res *Result) {
	checkKubernetesRefs(r, res)
	standalone := len(res.Envoy) == 0 && len(res.Objects) == 0 // a plugin configuration file
	vmIDs := map[string]bool{}
	var cfgs []*config.Config
	var cfgPlugins []Plugin
	for _, p := range res.Plugins {
		at := func(field string) string { return joinField(p.Path, field) }
		if !standalone && p.RootID != "kvroute.router" && p.RootID != "kvroute.pd" {
			r.add(p.Doc, p.Path, "root id %q: want kvroute.router or kvroute.pd", p.RootID)
		}
		cfg, _, warnings, err := scorer.Load(p.Config)
		if err != nil {
			var errs config.Errors
			if errors.As(err, &errs) {
				for _, e := range errs {
					r.add(p.Doc, at(e.Path), "%s", e.Msg)
				}
			} else {
				r.add(p.Doc, p.Path, "plugin configuration: %v", err)
			}
			continue
		}
		cfgs = append(cfgs, cfg)
		cfgPlugins = append(cfgPlugins, p)
		for _, w := range warnings {
			r.add(p.Doc, p.Path, "the strategy configuration draws a warning: %s", w)
		}
		if p.AllowOnHeadersStopIteration != nil { // Envoy-level config we control
			vmIDs[p.VMID] = true
		}
		if standalone {
			continue
		}
		if cfg.BodyRouting && (p.AllowOnHeadersStopIteration == nil || !*p.AllowOnHeadersStopIteration) {
			r.add(p.Doc, at("bodyRouting"), "bodyRouting is on but allow_on_headers_stop_iteration is not true: Envoy would pick the host before the filter sees the body")
		}
		if p.RootID == "kvroute.pd" && !cfg.BodyRouting {
			r.add(p.Doc, at("bodyRouting"), "kvroute.pd needs bodyRouting")
		}
		switch {
		case cfg.State.Token != "":
			r.add(p.Doc, at("state.token"), "state.token puts the secret in the manifest: use state.tokenEnv and pass the variable to the VM")
		case cfg.State.TokenEnv == "":
			r.add(p.Doc, at("state"), "no state.tokenEnv: every push from kvroute metrics would get 401")
		case !slices.Contains(p.HostEnvKeys, cfg.State.TokenEnv):
			r.add(p.Doc, at("state.tokenEnv"), "state.tokenEnv %s is not passed to the VM (vm_config.environment_variables.host_env_keys, WasmPlugin vmConfig.env, Envoy Gateway env.hostKeys): the VM would read it empty", cfg.State.TokenEnv)
		}
	}
	if standalone || len(cfgs) == 0 {
		return
	}
	if len(vmIDs) > 1 {
		r.add(-1, "", "kvroute filters run in vm_ids %v: router, pd and the state endpoint must share one VM (shared data is per vm_id)", sortedKeys(vmIDs))
	}
	if len(vmIDs) == 1 && vmIDs[""] {
		r.add(-1, "", "vm_id is empty")
	}
	for i, c := range cfgs[1:] {
		p := cfgPlugins[i+1]
		if c.DestinationHeader != cfgs[0].DestinationHeader {
			r.add(p.Doc, joinField(p.Path, "destinationHeader"), "plugins disagree on destinationHeader (%q, %q)", cfgs[0].DestinationHeader, c.DestinationHeader)
		}
		// Endpoints and state are what the filters of one VM must agree on.
		if fmt.Sprint(cfgs[0].Endpoints) != fmt.Sprint(c.Endpoints) || cfgs[0].State != c.State {
			r.add(p.Doc, p.Path, "endpoints or state differ from the first plugin's (%s): filters sharing a VM must agree", cfgPlugins[0].Path)
		}
	}
	hasPD := false
	for _, p := range cfgPlugins {
		hasPD = hasPD || p.RootID == "kvroute.pd"
	}
	if hasPD {
		clusters := knownClusters(res)
		for i, p := range cfgPlugins {
			for field, name := range map[string]string{"pd.prefillCluster": cfgs[i].PD.PrefillCluster, "pd.decodeCluster": cfgs[i].PD.DecodeCluster} {
				if !clusters[name] {
					r.add(p.Doc, joinField(p.Path, field), "%q is not a cluster defined or patched here (%v)", name, sortedKeys(clusters))
				}
			}
		}
	}
	checkWiring(r, res, cfgs[0])
	checkStats(r, res)
}

// knownClusters lists the Envoy clusters a file defines (standalone), sets
// the load balancing of (Istio CLUSTER patches: outbound|PORT||SERVICE), or
// makes Envoy Gateway generate or add (httproute/NS/NAME/rule/N, patches).
func knownClusters(res *Result) map[string]bool {
	out := map[string]bool{}
	for _, r := range res.Envoy {
		switch m := r.Message.(type) {
		case *bootstrapv3.Bootstrap:
			for _, c := range m.GetStaticResources().GetClusters() {
				out[c.GetName()] = true
			}
		case *clusterv3.Cluster:
			if !strings.HasPrefix(m.GetName(), "outbound|8000||base") { // patchTarget's merge base
				out[m.GetName()] = true
			}
		}
	}
	for _, o := range res.Objects {
		switch v := o.Value.(type) {
		case *IstioObject:
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

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// located is a value found somewhere in the file.
type located[T any] struct {
	v    T
	doc  int
	path string
}

// checkWiring checks the Envoy side agrees with the plugin configuration.
func checkWiring(r *report, res *Result, cfg *config.Config) {
	header := cfg.DestinationHeader
	var overrideHeaders []located[string]
	var bufferLimits []located[uint32]
	stripped := false // a filter or setting removes the client's header before kvroute
	for _, er := range res.Envoy {
		switch m := er.Message.(type) {
		case *hcmv3.HttpFilter:
			for _, mu := range headerMutations(m) {
				stripped = stripped || mu.GetRemove() == header
			}
		case *bootstrapv3.Bootstrap:
			stripped = true // checkListener requires it per listener
			for i, l := range m.GetStaticResources().GetListeners() {
				at := index("static_resources.listeners", i)
				checkListener(r, er.Doc, at, l, header)
				if hasKvroute(l) && routesToCluster(l) {
					bufferLimits = append(bufferLimits, located[uint32]{l.GetPerConnectionBufferLimitBytes().GetValue(), er.Doc, at})
				}
			}
			for i, c := range m.GetStaticResources().GetClusters() {
				at := index("static_resources.clusters", i)
				h, _, err := ClusterHostHeader(c)
				if err != nil {
					r.add(er.Doc, at, "cluster %s: %v", c.GetName(), err)
				}
				overrideHeaders = append(overrideHeaders, located[string]{h, er.Doc, at})
				if c.GetType() == clusterv3.Cluster_ORIGINAL_DST && cfg.Fallbacks != 0 {
					r.add(er.Doc, at+".type", "cluster %s is ORIGINAL_DST, which takes one address: set \"fallbacks\": 0 in the plugin configuration", c.GetName())
				}
				if c.GetType() == clusterv3.Cluster_STATIC {
					checkEndpointsInCluster(r, er.Doc, at, c, cfg)
				}
			}
		case *clusterv3.Cluster:
			h, _, err := ClusterHostHeader(m)
			if err != nil {
				r.add(er.Doc, er.Path, "cluster %s: %v", m.GetName(), err)
			}
			overrideHeaders = append(overrideHeaders, located[string]{h, er.Doc, er.Path})
		case *listenerv3.Listener:
			if m.GetPerConnectionBufferLimitBytes() != nil {
				bufferLimits = append(bufferLimits, located[uint32]{m.GetPerConnectionBufferLimitBytes().GetValue(), er.Doc, er.Path})
			}
		}
	}
	for _, o := range res.Objects {
		switch v := o.Value.(type) {
		case *egv1a1.BackendTrafficPolicy:
			if eo := v.Spec.LoadBalancer; eo != nil && eo.EndpointOverride != nil {
				for i, ef := range eo.EndpointOverride.ExtractFrom {
					if ef.Header != nil {
						overrideHeaders = append(overrideHeaders, located[string]{*ef.Header, o.Doc, index("spec.loadBalancer.endpointOverride.extractFrom", i) + ".header"})
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
			if cfg.State.TokenEnv != "" && !slices.Contains(env, cfg.State.TokenEnv) {
				r.add(o.Doc, "spec.provider.kubernetes.envoyDeployment.container.env", "the Envoy container's env does not set %s, which the plugins read (state.tokenEnv)", cfg.State.TokenEnv)
			}
		case *egv1a1.ClientTrafficPolicy:
			if c := v.Spec.Connection; c != nil && c.BufferLimit != nil {
				bufferLimits = append(bufferLimits, located[uint32]{uint32(c.BufferLimit.Value()), o.Doc, "spec.connection.bufferLimit"})
			}
			if h := v.Spec.Headers; h == nil || h.EarlyRequestHeaders == nil || !slices.Contains(h.EarlyRequestHeaders.Remove, header) {
				r.add(o.Doc, "spec.headers", "headers.earlyRequestHeaders.remove must list %s so a client cannot steer the request", header)
			}
			stripped = true
		}
	}
	if cfg.BodyRouting {
		if len(bufferLimits) == 0 {
			r.add(-1, "", "no connection buffer limit is raised: bodies over 1 MiB would get 413 from Envoy")
		}
		for _, b := range bufferLimits {
			if int(b.v) < cfg.MaxBodyBytes {
				r.add(b.doc, b.path, "connection buffer limit %d is below maxBodyBytes %d: Envoy would answer 413 before the filter decides", b.v, cfg.MaxBodyBytes)
			}
		}
	}
	if !stripped {
		r.add(-1, "", "nothing removes a client's %s before kvroute runs (header_mutation filter, earlyRequestHeaders): with the VM failed open a client would pick the replica", header)
	}
	any := false
	for _, h := range overrideHeaders {
		if h.v != "" && h.v != header {
			r.add(h.doc, h.path, "the cluster reads the host from %q but the filter writes %q (destinationHeader)", h.v, header)
		}
		any = any || h.v != ""
	}
	if !any {
		r.add(-1, "", "no cluster reads %s (override_host or ORIGINAL_DST): the decision would be ignored", header)
	}
}

// headerMutations returns the request mutations of a header_mutation filter.
func headerMutations(f *hcmv3.HttpFilter) []*mutationrulesv3.HeaderMutation {
	hm := &headermutationv3.HeaderMutation{}
	if f.GetTypedConfig().MessageIs(hm) && f.GetTypedConfig().UnmarshalTo(hm) == nil {
		return hm.GetMutations().GetRequestMutations()
	}
	return nil
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
			for _, rt := range vh.GetRoutes() {
				if rt.GetRoute() != nil {
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
func checkListener(r *report, doc int, at string, l *listenerv3.Listener, header string) {
	for _, h := range hcmOf(l) {
		stripped := false
		for _, f := range h.GetHttpFilters() {
			for _, m := range headerMutations(f) {
				stripped = stripped || m.GetRemove() == header
			}
			pc := wasmOf(f)
			if pc == nil || pc.GetRootId() != "kvroute.router" {
				continue
			}
			routing := false
			for _, vh := range h.GetRouteConfig().GetVirtualHosts() {
				for _, rt := range vh.GetRoutes() {
					if rt.GetRoute() == nil {
						continue
					}
					routing = true
					if d := rt.GetRoute().GetTimeout(); d == nil || d.AsDuration() != 0 {
						r.add(doc, at, "listener %s: route timeout %v would cut long streamed generations: set timeout: 0s and an idle_timeout", l.GetName(), d.AsDuration())
					}
				}
			}
			if routing && !stripped {
				r.add(doc, at, "listener %s: %s is not removed (header_mutation) before kvroute.router", l.GetName(), header)
			}
		}
	}
}

// ClusterHostHeader returns the header a cluster takes its host from:
// override_host's header source, or with ORIGINAL_DST its http_header_name
// (Envoy's x-envoy-original-dst-host by default), origDst saying which; ""
// when the cluster reads none.
func ClusterHostHeader(c *clusterv3.Cluster) (header string, origDst bool, err error) {
	if c.GetType() == clusterv3.Cluster_ORIGINAL_DST {
		if !c.GetOriginalDstLbConfig().GetUseHttpHeader() {
			return "", true, errors.New("ORIGINAL_DST without use_http_header ignores the filter")
		}
		if h := c.GetOriginalDstLbConfig().GetHttpHeaderName(); h != "" {
			return h, true, nil
		}
		return "x-envoy-original-dst-host", true, nil
	}
	for _, p := range c.GetLoadBalancingPolicy().GetPolicies() {
		oh := &overridehostv3.OverrideHost{}
		tc := p.GetTypedExtensionConfig().GetTypedConfig()
		if !tc.MessageIs(oh) {
			continue
		}
		if err := tc.UnmarshalTo(oh); err != nil {
			return "", false, err
		}
		if oh.GetFallbackPolicy() == nil {
			return "", false, errors.New("override_host needs a fallback_policy")
		}
		for _, s := range oh.GetOverrideHostSources() {
			if s.GetHeader() != "" {
				return s.GetHeader(), false, nil
			}
		}
	}
	return "", false, nil
}

// checkEndpointsInCluster: every static endpoint the plugin may name must be
// in the cluster for its role, or override_host would skip it.
func checkEndpointsInCluster(r *report, doc int, at string, c *clusterv3.Cluster, cfg *config.Config) {
	have := map[string]bool{}
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			have[fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())] = true
		}
	}
	wantRole := snapshot.RoleDecode
	if strings.Contains(c.GetName(), "prefill") {
		wantRole = snapshot.RolePrefill
	}
	for _, e := range cfg.Endpoints {
		if e.Role == wantRole || (e.Role == snapshot.RoleBoth && wantRole == snapshot.RoleDecode) {
			if !have[e.Address] {
				r.add(doc, at+".load_assignment", "cluster %s lacks endpoint %s (role %s) named in the plugin configuration", c.GetName(), e.Address, e.Role)
			}
		}
	}
}

// checkKubernetesRefs: the references between the Kubernetes objects of one
// file resolve (what kubectl apply accepts but the pod would then fail on).
func checkKubernetesRefs(r *report, res *Result) {
	has := map[string]bool{}
	for _, o := range res.Objects {
		has[o.Kind+"/"+o.Namespace+"/"+o.Name] = true
	}
	for _, o := range res.Objects {
		switch v := o.Value.(type) {
		case *appsv1.Deployment:
			checkDeploymentRefs(r, res, o, v, has)
		case *rbacv1.RoleBinding:
			if !has[v.RoleRef.Kind+"/"+v.Namespace+"/"+v.RoleRef.Name] && !has[v.RoleRef.Kind+"//"+v.RoleRef.Name] {
				r.add(o.Doc, "roleRef", "%s %q is not in this file", v.RoleRef.Kind, v.RoleRef.Name)
			}
			for i, sub := range v.Subjects {
				if sub.Kind == "ServiceAccount" && !has["ServiceAccount/"+sub.Namespace+"/"+sub.Name] {
					r.add(o.Doc, index("subjects", i), "ServiceAccount %s/%s is not in this file", sub.Namespace, sub.Name)
				}
			}
		case *rbacv1.Role:
			if !grants(v.Rules, "discovery.k8s.io", "endpointslices", "list", "watch") {
				r.add(o.Doc, "rules", "rules do not grant list and watch on discovery.k8s.io endpointslices, which discovery needs")
			}
		}
	}
}

func checkDeploymentRefs(r *report, res *Result, o Object, v *appsv1.Deployment, has map[string]bool) {
	sel, err := metav1.LabelSelectorAsSelector(v.Spec.Selector)
	if err != nil {
		r.add(o.Doc, "spec.selector", "%v", err)
		return
	}
	podLabels := labels.Set(v.Spec.Template.Labels)
	if !sel.Matches(podLabels) {
		r.add(o.Doc, "spec.selector", "does not match the pod template's labels")
	}
	pod := v.Spec.Template.Spec
	if sa := pod.ServiceAccountName; sa != "" && !has["ServiceAccount/"+v.Namespace+"/"+sa] {
		r.add(o.Doc, "spec.template.spec.serviceAccountName", "%q is not in this file", sa)
	}
	mounts := map[string]bool{}
	for i, vol := range pod.Volumes {
		mounts[vol.Name] = true
		if vol.Secret != nil && !has["Secret/"+v.Namespace+"/"+vol.Secret.SecretName] {
			r.add(o.Doc, index("spec.template.spec.volumes", i)+".secret.secretName", "Secret %q is not in this file", vol.Secret.SecretName)
		}
	}
	for ci, c := range pod.Containers {
		at := index("spec.template.spec.containers", ci)
		ports := map[string]bool{}
		for _, p := range c.Ports {
			ports[p.Name] = true
		}
		for field, probe := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
			if probe != nil && probe.HTTPGet != nil && probe.HTTPGet.Port.StrVal != "" && !ports[probe.HTTPGet.Port.StrVal] {
				r.add(o.Doc, at+"."+field+".httpGet.port", "probe port %q is not a named port of container %s", probe.HTTPGet.Port.StrVal, c.Name)
			}
		}
		for mi, m := range c.VolumeMounts {
			if !mounts[m.Name] {
				r.add(o.Doc, index(at+".volumeMounts", mi), "volumeMount %q has no volume", m.Name)
			}
		}
	}
	// Every Service of the file that selects these pods.
	for _, o2 := range res.Objects {
		if svc, ok := o2.Value.(*corev1.Service); ok && svc.Namespace == v.Namespace {
			if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
				r.add(o2.Doc, "spec.selector", "matches no pod of Deployment %s", v.Name)
			}
		}
	}
}

func grants(rules []rbacv1.PolicyRule, group, resource string, verbs ...string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) {
			ok := true
			for _, v := range verbs {
				ok = ok && (slices.Contains(r.Verbs, v) || slices.Contains(r.Verbs, "*"))
			}
			if ok {
				return true
			}
		}
	}
	return false
}
