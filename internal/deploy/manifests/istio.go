package manifests

import (
	"fmt"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	istioext "istio.io/api/extensions/v1alpha1"
	istionet "istio.io/api/networking/v1alpha3"
)

// patchTarget returns the Envoy message an EnvoyFilter patch value is, for
// each applyTo the manifests use, and a minimal valid instance of it that a
// MERGE patch is merged onto (Istio merges patches into the generated
// resource, so a partial value is not valid alone).
func patchTarget(applyTo istionet.EnvoyFilter_ApplyTo) (newMsg func() proto.Message, base func() proto.Message, err error) {
	switch applyTo {
	case istionet.EnvoyFilter_HTTP_FILTER:
		return func() proto.Message { return &hcmv3.HttpFilter{} },
			func() proto.Message { return &hcmv3.HttpFilter{Name: "istio.base"} }, nil
	case istionet.EnvoyFilter_CLUSTER:
		return func() proto.Message { return &clusterv3.Cluster{} },
			func() proto.Message {
				return &clusterv3.Cluster{
					Name:                 "outbound|8000||base.svc.cluster.local",
					ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
					EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
						ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
					}},
				}
			}, nil
	case istionet.EnvoyFilter_LISTENER:
		return func() proto.Message { return &listenerv3.Listener{} },
			func() proto.Message { return &listenerv3.Listener{Name: "0.0.0.0_8080"} }, nil
	case istionet.EnvoyFilter_NETWORK_FILTER:
		return func() proto.Message { return &listenerv3.Filter{} },
			func() proto.Message { return &listenerv3.Filter{Name: "istio.base"} }, nil
	case istionet.EnvoyFilter_ROUTE_CONFIGURATION:
		return func() proto.Message { return &routev3.RouteConfiguration{} },
			func() proto.Message { return &routev3.RouteConfiguration{Name: "http.8080"} }, nil
	case istionet.EnvoyFilter_VIRTUAL_HOST:
		return func() proto.Message { return &routev3.VirtualHost{} },
			func() proto.Message { return &routev3.VirtualHost{Name: "base", Domains: []string{"*"}} }, nil
	case istionet.EnvoyFilter_HTTP_ROUTE:
		return func() proto.Message { return &routev3.Route{} },
			func() proto.Message {
				return &routev3.Route{
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "base"}}},
				}
			}, nil
	case istionet.EnvoyFilter_EXTENSION_CONFIG:
		return func() proto.Message { return &corev3.TypedExtensionConfig{} }, nil, nil
	}
	return nil, nil, fmt.Errorf("applyTo %s is not checked yet (add it to patchTarget)", applyTo)
}

func checkIstio(r *report, res *Result, obj Object, io *IstioObject) {
	switch spec := io.Spec.(type) {
	case *istionet.EnvoyFilter:
		checkEnvoyFilter(r, res, obj, spec)
	case *istioext.WasmPlugin:
		if spec.GetUrl() == "" {
			r.add(obj.Doc, "spec.url", "is required")
		}
		var cfg []byte
		if spec.GetPluginConfig() != nil {
			var err error
			if cfg, err = protojson.Marshal(spec.GetPluginConfig()); err != nil {
				r.add(obj.Doc, "spec.pluginConfig", "%v", err)
				return
			}
		}
		var env []string
		for _, e := range spec.GetVmConfig().GetEnv() {
			if e.GetValueFrom() == istioext.EnvValueSource_HOST {
				env = append(env, e.GetName())
			}
		}
		res.Plugins = append(res.Plugins, Plugin{Where: obj.Where + " spec.pluginConfig", Doc: obj.Doc, Path: "spec.pluginConfig",
			RootID: spec.GetPluginName(), Config: cfg, HostEnvKeys: env})
	}
}

func checkEnvoyFilter(r *report, res *Result, obj Object, ef *istionet.EnvoyFilter) {
	if len(ef.GetConfigPatches()) == 0 {
		r.add(obj.Doc, "spec.configPatches", "is empty")
	}
	for i, cp := range ef.GetConfigPatches() {
		at := index("spec.configPatches", i)
		if r.has(obj.Doc, at) {
			continue // the decoder said what is wrong with it
		}
		if cp.GetApplyTo() == istionet.EnvoyFilter_INVALID {
			r.add(obj.Doc, at+".applyTo", "is required")
			continue
		}
		p := cp.GetPatch()
		if p == nil || p.GetOperation() == istionet.EnvoyFilter_Patch_INVALID {
			r.add(obj.Doc, at+".patch.operation", "is required")
			continue
		}
		if p.GetOperation() == istionet.EnvoyFilter_Patch_REMOVE {
			continue
		}
		valueAt := at + ".patch.value"
		if p.GetValue() == nil {
			r.add(obj.Doc, valueAt, "is required for %s", p.GetOperation())
			continue
		}
		newMsg, base, err := patchTarget(cp.GetApplyTo())
		if err != nil {
			r.add(obj.Doc, at+".applyTo", "%v", err)
			continue
		}
		js, err := protojson.Marshal(p.GetValue())
		if err != nil {
			r.add(obj.Doc, valueAt, "%v", err)
			continue
		}
		msg := newMsg()
		probs := decodeProto(js, msg)
		for _, fp := range probs {
			r.add(obj.Doc, joinField(valueAt, fp.path), "%s", fp.msg)
		}
		full := msg
		if p.GetOperation() == istionet.EnvoyFilter_Patch_MERGE && base != nil {
			full = base()
			proto.Merge(full, msg)
		}
		if len(probs) == 0 {
			for _, fp := range validateProto(full) {
				r.add(obj.Doc, joinField(valueAt, fp.path), "%s", fp.msg)
			}
		}
		where := obj.Where + " " + valueAt
		res.Envoy = append(res.Envoy, EnvoyResource{Where: where, Message: full, Doc: obj.Doc, Path: valueAt})
		res.Plugins = append(res.Plugins, r.wasmPlugins(obj.Doc, valueAt, full)...)
	}
}
