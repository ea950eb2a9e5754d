package manifests

import (
	"errors"
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

func checkIstio(res *Result, obj Object, io *IstioObject) error {
	switch spec := io.Spec.(type) {
	case *istionet.EnvoyFilter:
		return checkEnvoyFilter(res, obj, spec)
	case *istioext.WasmPlugin:
		where := obj.Where + " spec.pluginConfig"
		if spec.GetUrl() == "" {
			return fieldErr(obj.Where+" spec.url", errors.New("is required"))
		}
		var cfg []byte
		if spec.GetPluginConfig() != nil {
			var err error
			if cfg, err = protojson.Marshal(spec.GetPluginConfig()); err != nil {
				return fieldErr(where, err)
			}
		}
		var env []string
		for _, e := range spec.GetVmConfig().GetEnv() {
			if e.GetValueFrom() == istioext.EnvValueSource_HOST {
				env = append(env, e.GetName())
			}
		}
		res.Plugins = append(res.Plugins, Plugin{Where: where, RootID: spec.GetPluginName(), Config: cfg, HostEnvKeys: env})
	}
	return nil
}

func checkEnvoyFilter(res *Result, obj Object, ef *istionet.EnvoyFilter) error {
	if len(ef.GetConfigPatches()) == 0 {
		return fieldErr(obj.Where+" spec.configPatches", errors.New("is empty"))
	}
	for i, cp := range ef.GetConfigPatches() {
		where := fmt.Sprintf("%s spec.configPatches[%d]", obj.Where, i)
		if cp.GetApplyTo() == istionet.EnvoyFilter_INVALID {
			return fieldErr(where+".applyTo", errors.New("is required"))
		}
		p := cp.GetPatch()
		if p == nil || p.GetOperation() == istionet.EnvoyFilter_Patch_INVALID {
			return fieldErr(where+".patch.operation", errors.New("is required"))
		}
		if p.GetOperation() == istionet.EnvoyFilter_Patch_REMOVE {
			continue
		}
		if p.GetValue() == nil {
			return fieldErr(where+".patch.value", errors.New("is required for "+p.GetOperation().String()))
		}
		newMsg, base, err := patchTarget(cp.GetApplyTo())
		if err != nil {
			return fieldErr(where+".applyTo", err)
		}
		js, err := protojson.Marshal(p.GetValue())
		if err != nil {
			return fieldErr(where+".patch.value", err)
		}
		msg := newMsg()
		if err := protojson.Unmarshal(js, msg); err != nil {
			return fieldErr(where+".patch.value", withContext(err, js))
		}
		full := msg
		if p.GetOperation() == istionet.EnvoyFilter_Patch_MERGE && base != nil {
			full = base()
			proto.Merge(full, msg)
		}
		if err := validateEnvoy(where+".patch.value", full); err != nil {
			return err
		}
		res.Envoy = append(res.Envoy, EnvoyResource{Where: where + ".patch.value", Message: full})
		plugins, err := WasmPlugins(where+".patch.value:", full)
		if err != nil {
			return err
		}
		res.Plugins = append(res.Plugins, plugins...)
	}
	return nil
}
