package manifests

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/ohler55/ojg/jp"
	"github.com/ohler55/ojg/oj"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Envoy Gateway generates xDS from Gateway API objects and its policies; an
// EnvoyPatchPolicy then JSON-patches named xDS resources. To check a patch
// without running Envoy Gateway, checkEnvoyGateway builds the listeners it
// would generate for the Wasm extensions of each EnvoyExtensionPolicy (the
// filter name, vm_id and code source follow Envoy Gateway v1.9's
// translator), applies the patches the way it does (JSONPath expanded to
// JSON pointers, RFC 6902 with missing paths created on add), and decodes
// and validates the result as Envoy would receive it. A patch whose path
// matches nothing, or that produces an invalid resource, fails here as it
// would fail in the EnvoyPatchPolicy's status.

const (
	egWasmFilterPrefix = "envoy.filters.http.wasm/"
	egWasmRuntime      = "envoy.wasm.runtime.v8"
	egWasmCluster      = "wasm_cluster"
	egListenerType     = "type.googleapis.com/envoy.config.listener.v3.Listener"
	egClusterType      = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
)

// EGWasmName is the name Envoy Gateway gives the idx-th Wasm extension of an
// EnvoyExtensionPolicy: it is the vm_id, and with the filter prefix the
// HTTP filter name, that patches select.
func EGWasmName(namespace, policy string, idx int) string {
	return fmt.Sprintf("envoyextensionpolicy/%s/%s/wasm/%d", namespace, policy, idx)
}

type egWasm struct {
	policy *egv1a1.EnvoyExtensionPolicy
	idx    int
}

func checkEnvoyGateway(r *report, res *Result) {
	var (
		gateways []*gwapiv1.Gateway
		routes   []*gwapiv1.HTTPRoute
		eeps     []Object
		epps     []Object
	)
	for _, o := range res.Objects {
		switch v := o.Value.(type) {
		case *gwapiv1.Gateway:
			gateways = append(gateways, v)
		case *gwapiv1.HTTPRoute:
			routes = append(routes, v)
		case *egv1a1.EnvoyExtensionPolicy:
			eeps = append(eeps, o)
		case *egv1a1.EnvoyPatchPolicy:
			epps = append(epps, o)
		}
	}
	if len(eeps) == 0 && len(epps) == 0 {
		return
	}
	for _, o := range eeps {
		for i, w := range o.Value.(*egv1a1.EnvoyExtensionPolicy).Spec.Wasm {
			checkEGWasm(r, o.Doc, index("spec.wasm", i), &w)
		}
	}

	// The listeners Envoy Gateway would generate, by xDS name.
	listeners := map[string]*listenerv3.Listener{}
	var listenerOrder []string
	for _, gw := range gateways {
		for _, l := range gw.Spec.Listeners {
			name := gw.Namespace + "/" + gw.Name + "/" + string(l.Name)
			var wasms []egWasm
			for _, o := range eeps {
				e := o.Value.(*egv1a1.EnvoyExtensionPolicy)
				if eepAppliesTo(e, gw, string(l.Name), routes) {
					for i := range e.Spec.Wasm {
						wasms = append(wasms, egWasm{policy: e, idx: i})
					}
				}
			}
			lis, err := egListener(name, int(l.Port), wasms)
			if err != nil {
				r.add(-1, "", "generating listener %s: %v", name, err)
				continue
			}
			listeners[name] = lis
			listenerOrder = append(listenerOrder, name)
		}
	}

	for _, o := range epps {
		epp := o.Value.(*egv1a1.EnvoyPatchPolicy)
		if epp.Spec.Type != egv1a1.JSONPatchEnvoyPatchType {
			r.add(o.Doc, "spec.type", "%q: only JSONPatch exists", epp.Spec.Type)
			continue
		}
		for i, p := range epp.Spec.JSONPatches {
			applyEGPatch(r, res, o.Doc, index("spec.jsonPatches", i), p, listeners)
		}
	}
	// A policy that reaches no listener of this file (its Gateway is
	// elsewhere) still has its plugin configurations checked, as written.
	for _, o := range eeps {
		e := o.Value.(*egv1a1.EnvoyExtensionPolicy)
		attached := false
		for _, gw := range gateways {
			for _, l := range gw.Spec.Listeners {
				attached = attached || eepAppliesTo(e, gw, string(l.Name), routes)
			}
		}
		if attached {
			continue
		}
		for i, w := range e.Spec.Wasm {
			at := index("spec.wasm", i) + ".config"
			p := Plugin{Where: o.Where + " " + at, Doc: o.Doc, Path: at, VMID: EGWasmName(e.Namespace, e.Name, i)}
			if w.RootID != nil {
				p.RootID = *w.RootID
			}
			if w.Config != nil {
				p.Config = w.Config.Raw
			}
			if w.Env != nil {
				p.HostEnvKeys = w.Env.HostKeys
			}
			res.Plugins = append(res.Plugins, p)
		}
	}
	// What Envoy would receive: the patched listeners and the plugins in
	// them, each plugin located at the policy entry it came from.
	for _, name := range listenerOrder {
		lis := listeners[name]
		where := r.file + ": Envoy Gateway listener " + name
		for _, fp := range validateProto(lis) {
			r.add(-1, "", "Envoy Gateway listener %s (as generated and patched): %s: %s", name, fp.path, fp.msg)
		}
		res.Envoy = append(res.Envoy, EnvoyResource{Where: where, Message: lis, Doc: -1})
		for _, p := range r.wasmPlugins(-1, "", lis) {
			p.Where = where + ": " + p.Path
			p.Doc, p.Path = egPluginSource(eeps, p)
			res.Plugins = append(res.Plugins, p)
		}
	}
}

// egPluginSource finds the EnvoyExtensionPolicy entry a generated plugin
// came from (same root id and configuration): its document and config path.
func egPluginSource(eeps []Object, p Plugin) (int, string) {
	for _, o := range eeps {
		for i, w := range o.Value.(*egv1a1.EnvoyExtensionPolicy).Spec.Wasm {
			raw := ""
			if w.Config != nil {
				raw = string(w.Config.Raw)
			}
			if w.RootID != nil && *w.RootID == p.RootID && raw == string(p.Config) {
				return o.Doc, index("spec.wasm", i) + ".config"
			}
		}
	}
	return -1, ""
}

func checkEGWasm(r *report, doc int, at string, w *egv1a1.Wasm) {
	switch w.Code.Type {
	case egv1a1.ImageWasmCodeSourceType:
		if w.Code.Image == nil || w.Code.Image.URL == "" {
			r.add(doc, at+".code.image.url", "is required when code.type is Image")
		}
	case egv1a1.HTTPWasmCodeSourceType:
		if w.Code.HTTP == nil || w.Code.HTTP.URL == "" {
			r.add(doc, at+".code.http.url", "is required when code.type is HTTP")
		}
	default:
		r.add(doc, at+".code.type", "%q: want Image or HTTP", w.Code.Type)
	}
	if w.Config != nil && !json.Valid(w.Config.Raw) {
		r.add(doc, at+".config", "is not JSON")
	}
}

// eepAppliesTo reports whether policy e puts its filters on listener
// section of gw: it targets the Gateway, or an HTTPRoute attached to it.
func eepAppliesTo(e *egv1a1.EnvoyExtensionPolicy, gw *gwapiv1.Gateway, section string, routes []*gwapiv1.HTTPRoute) bool {
	refs := e.Spec.TargetRefs
	if e.Spec.TargetRef != nil {
		refs = append(refs, *e.Spec.TargetRef)
	}
	for _, ref := range refs {
		switch ref.Kind {
		case "Gateway":
			if string(ref.Name) == gw.Name && (ref.SectionName == nil || string(*ref.SectionName) == section) {
				return true
			}
		case "HTTPRoute":
			for _, r := range routes {
				if r.Name != string(ref.Name) || r.Namespace != e.Namespace {
					continue
				}
				for _, pr := range r.Spec.ParentRefs {
					if string(pr.Name) == gw.Name && (pr.SectionName == nil || string(*pr.SectionName) == section) {
						return true
					}
				}
			}
		}
	}
	return false
}

// egListener builds the listener Envoy Gateway generates: one HCM whose
// HTTP filters are the Wasm extensions (disabled by default, enabled per
// route) and the router.
func egListener(name string, port int, wasms []egWasm) (*listenerv3.Listener, error) {
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: "http-" + strconv.Itoa(port),
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			RouteConfigName: name,
			ConfigSource: &corev3.ConfigSource{
				ResourceApiVersion:    corev3.ApiVersion_V3,
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			},
		}},
	}
	for _, w := range wasms {
		f, err := egWasmFilter(w)
		if err != nil {
			return nil, err
		}
		hcm.HttpFilters = append(hcm.HttpFilters, f)
	}
	router, _ := anypb.New(&routerv3.Router{})
	hcm.HttpFilters = append(hcm.HttpFilters, &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}})
	hcmAny, err := anypb.New(hcm)
	if err != nil {
		return nil, err
	}
	return &listenerv3.Listener{
		Name: name,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "0.0.0.0", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(10000 + port)},
		}}},
		DefaultFilterChain: &listenerv3.FilterChain{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcmAny},
		}}},
	}, nil
}

func egWasmFilter(w egWasm) (*hcmv3.HttpFilter, error) {
	spec := w.policy.Spec.Wasm[w.idx]
	name := EGWasmName(w.policy.Namespace, w.policy.Name, w.idx)
	wasmName := name
	if spec.Name != nil {
		wasmName = *spec.Name
	}
	cfg := ""
	if spec.Config != nil {
		cfg = string(spec.Config.Raw)
	}
	cfgAny, err := anypb.New(wrapperspb.String(cfg))
	if err != nil {
		return nil, err
	}
	// Envoy Gateway serves the module from its own cache, named by a hash.
	sum := sha256.Sum256([]byte(name))
	pc := &wasmv3.PluginConfig{
		Name: wasmName,
		Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{
			VmId:    name,
			Runtime: egWasmRuntime,
			Code: &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{Remote: &corev3.RemoteDataSource{
				HttpUri: &corev3.HttpUri{
					Uri:              "https://envoy-gateway:18002/" + hex.EncodeToString(sum[:8]) + ".wasm",
					HttpUpstreamType: &corev3.HttpUri_Cluster{Cluster: egWasmCluster},
					Timeout:          durationpb.New(10 * time.Second),
				},
				Sha256: hex.EncodeToString(sum[:]),
			}}},
		}},
		Configuration: cfgAny,
		FailOpen:      spec.FailOpen != nil && *spec.FailOpen,
	}
	if spec.RootID != nil {
		pc.RootId = *spec.RootID
	}
	if spec.Env != nil && len(spec.Env.HostKeys) > 0 {
		pc.GetVmConfig().EnvironmentVariables = &wasmv3.EnvironmentVariables{HostEnvKeys: spec.Env.HostKeys}
	}
	a, err := anypb.New(&wasmfilterv3.Wasm{Config: pc})
	if err != nil {
		return nil, err
	}
	return &hcmv3.HttpFilter{Name: egWasmFilterPrefix + name, Disabled: true, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: a}}, nil
}

var egMarshal = protojson.MarshalOptions{UseProtoNames: true}

func applyEGPatch(r *report, res *Result, doc int, at string, p egv1a1.EnvoyJSONPatchConfig, listeners map[string]*listenerv3.Listener) {
	op := p.Operation
	noPath := (op.Path == nil || *op.Path == "") && (op.JSONPath == nil || *op.JSONPath == "")
	// problems reports what Envoy Gateway would reject in the patched
	// resource; its paths are in the generated resource, not in this file.
	problems := func(what string, probs []fieldProblem) bool {
		for _, fp := range probs {
			r.add(doc, at+".operation", "the patched %s is invalid at %s: %s", what, fp.path, fp.msg)
		}
		return len(probs) == 0
	}
	// patch applies the operation to the resource Envoy Gateway generates,
	// reporting why it could not.
	patch := func(generated proto.Message) ([]byte, bool) {
		js, err := egMarshal.Marshal(generated)
		if err != nil {
			r.add(doc, at, "%v", err)
			return nil, false
		}
		out, err := applyJSONPatch(at+".operation", js, op)
		if err != nil {
			r.addErr(doc, "", err)
			return nil, false
		}
		return out, true
	}
	switch string(p.Type) {
	case egListenerType:
		lis, ok := listeners[p.Name]
		if !ok {
			var names []string
			for n := range listeners {
				names = append(names, n)
			}
			sort.Strings(names)
			r.add(doc, at+".name", "no listener %q: Envoy Gateway names listeners NAMESPACE/GATEWAY/LISTENER; this file generates %v", p.Name, names)
			return
		}
		out, ok := patch(lis)
		if !ok {
			return
		}
		next := &listenerv3.Listener{}
		if problems("listener "+p.Name, decodeProto(out, next)) {
			listeners[p.Name] = next
		}
	case egClusterType:
		if noPath {
			// A whole new resource.
			if op.Op != "add" || op.Value == nil {
				r.add(doc, at+".operation", "without a path only op add with a value (a complete Cluster) is meaningful")
				return
			}
			c := &clusterv3.Cluster{}
			probs := envoyProblems(op.Value.Raw, c)
			for _, fp := range probs {
				r.add(doc, joinField(at+".operation.value", fp.path), "%s", fp.msg)
			}
			if c.GetName() != p.Name && len(probs) == 0 {
				r.add(doc, at+".name", "%q differs from the added cluster's name %q", p.Name, c.GetName())
			}
			res.Envoy = append(res.Envoy, EnvoyResource{Where: r.file + ": " + at, Message: c, Doc: doc, Path: at + ".operation.value"})
			return
		}
		// A cluster Envoy Gateway generates for a route rule.
		if !strings.HasPrefix(p.Name, "httproute/") {
			r.add(doc, at+".name", "%q: the checker only knows route clusters (httproute/NS/NAME/rule/N)", p.Name)
			return
		}
		base := &clusterv3.Cluster{
			Name:                 p.Name,
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{ServiceName: p.Name, EdsConfig: &corev3.ConfigSource{
				ResourceApiVersion: corev3.ApiVersion_V3, ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			}},
		}
		out, ok := patch(base)
		if !ok {
			return
		}
		c := &clusterv3.Cluster{}
		if problems("cluster "+p.Name, envoyProblems(out, c)) {
			res.Envoy = append(res.Envoy, EnvoyResource{Where: r.file + ": " + at, Message: c, Doc: doc, Path: at + ".operation"})
		}
	default:
		r.add(doc, at+".type", "%q is not checked yet (Listener and Cluster are)", p.Type)
	}
}

// applyJSONPatch applies one operation as Envoy Gateway does: a JSONPath is
// expanded to every JSON pointer it matches (none is an error), the path is
// appended to each, and missing parents are created on add.
func applyJSONPatch(where string, doc []byte, op egv1a1.JSONPatchOperation) ([]byte, error) {
	suffix := ""
	if op.Path != nil {
		suffix = *op.Path
	}
	var pointers []string
	if op.JSONPath != nil && *op.JSONPath != "" {
		parsed, err := oj.Parse(doc)
		if err != nil {
			return nil, err
		}
		expr, err := jp.ParseString(*op.JSONPath)
		if err != nil {
			return nil, pathErr(where+".jsonPath", err)
		}
		for _, loc := range expr.Locate(parsed, 0) {
			ptr, err := pointerOf(loc)
			if err != nil {
				return nil, pathErr(where+".jsonPath", err)
			}
			if suffix != "" {
				ptr = strings.TrimSuffix(ptr, "/") + "/" + strings.TrimPrefix(suffix, "/")
			}
			pointers = append(pointers, ptr)
		}
		if len(pointers) == 0 {
			return nil, pathErr(where+".jsonPath", fmt.Errorf("%q matches nothing in the generated resource", *op.JSONPath))
		}
	} else {
		if suffix == "" {
			return nil, pathErr(where+".path", errors.New("path or jsonPath is required"))
		}
		pointers = []string{suffix}
	}
	opts := jsonpatch.NewApplyOptions()
	opts.EnsurePathExistsOnAdd = true
	for _, ptr := range pointers {
		one := map[string]any{"op": string(op.Op), "path": ptr}
		if op.From != nil {
			one["from"] = *op.From
		}
		if op.Value != nil {
			one["value"] = json.RawMessage(op.Value.Raw)
		}
		raw, err := json.Marshal([]any{one})
		if err != nil {
			return nil, err
		}
		patch, err := jsonpatch.DecodePatch(raw)
		if err != nil {
			return nil, pathErr(where, err)
		}
		if doc, err = patch.ApplyWithOptions(doc, opts); err != nil {
			return nil, pathErr(where, fmt.Errorf("op %s at %s: %w", op.Op, ptr, err))
		}
	}
	return doc, nil
}

// pointerOf turns a normalized JSONPath location into an RFC 6901 pointer.
func pointerOf(loc jp.Expr) (string, error) {
	var b strings.Builder
	for _, frag := range loc {
		switch f := frag.(type) {
		case jp.Root:
		case jp.Child:
			b.WriteByte('/')
			b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(string(f)))
		case jp.Nth:
			b.WriteByte('/')
			b.WriteString(strconv.Itoa(int(f)))
		default:
			return "", fmt.Errorf("unexpected location fragment %T", frag)
		}
	}
	return b.String(), nil
}
