package manifests

import (
	"encoding/json"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

func TestPolicyWithoutItsGatewayStillYieldsPlugins(t *testing.T) {
	doc := `apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyExtensionPolicy
metadata: {name: p, namespace: ns}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: elsewhere}]
  wasm:
  - rootID: kvroute.router
    code: {type: Image, image: {url: r/k:t}}
    config: {strategy: round_robin}
    env: {hostKeys: [TOKEN]}
`
	res, err := Check("p.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Plugins) != 1 {
		t.Fatalf("plugins = %+v", res.Plugins)
	}
	p := res.Plugins[0]
	if p.RootID != "kvroute.router" || string(p.Config) != `{"strategy":"round_robin"}` || p.VMID != "envoyextensionpolicy/ns/p/wasm/0" || len(p.HostEnvKeys) != 1 {
		t.Errorf("plugin = %+v (config %s)", p, p.Config)
	}
}

func TestRefusals(t *testing.T) {
	for name, c := range map[string]struct{ doc, want string }{
		"unknown kind":       {"apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n", "example.com/v1/Widget"},
		"no kind":            {"apiVersion: v1\nmetadata: {name: w}\n", "apiVersion and kind are required"},
		"no name":            {"apiVersion: v1\nkind: ServiceAccount\nmetadata: {namespace: x}\n", "metadata.name"},
		"duplicate key":      {"apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a, name: b}\n", "duplicate"},
		"unknown k8s field":  {"apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a}\nsecret: []\n", `unknown field "secret"`},
		"istio spec field":   {"apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {name: a}\nspec: {urll: x}\n", "urll"},
		"wasm plugin no url": {"apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {name: a}\nspec: {pluginName: x}\n", "spec.url"},
		"real secret":        {"apiVersion: v1\nkind: Secret\nmetadata: {name: a}\nstringData: {token: abc}\n", "placeholder"},
		"envoy bad duration": {"static_resources: {clusters: [{name: a, connect_timeout: soon}]}\n", `"connect_timeout":⟨here⟩"soon"`},
		"envoy unknown":      {"static_resources: {clusterz: []}\n", "clusterz"},
		"envoy any type":     {"static_resources: {listeners: [{name: l, address: {socket_address: {address: 0.0.0.0, port_value: 1}}, filter_chains: [{filters: [{name: f, typed_config: {'@type': type.googleapis.com/nope.Nope}}]}]}]}\n", "nope.Nope"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Check(name+".yaml", []byte(c.doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestApplyJSONPatch(t *testing.T) {
	doc := []byte(`{"filters":[{"name":"a/b","config":{}},{"name":"c","config":{}}]}`)
	jp := "..filters[?(@.name=='a/b')].config"
	path := "/x/y"
	out, err := applyJSONPatch("op", doc, egv1a1.JSONPatchOperation{Op: "add", JSONPath: &jp, Path: &path, Value: &apiextensionsv1.JSON{Raw: []byte(`true`)}})
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Filters []map[string]any }
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if cfg := got.Filters[0]["config"].(map[string]any); cfg["x"].(map[string]any)["y"] != true {
		t.Errorf("patch landed wrong: %s", out)
	}
	if len(got.Filters[1]["config"].(map[string]any)) != 0 {
		t.Errorf("patch touched the other filter: %s", out)
	}
	miss := "..filters[?(@.name=='z')]"
	if _, err := applyJSONPatch("op", doc, egv1a1.JSONPatchOperation{Op: "remove", JSONPath: &miss}); err == nil || !strings.Contains(err.Error(), "matches nothing") {
		t.Errorf("unmatched jsonPath: %v", err)
	}
	if _, err := applyJSONPatch("op", doc, egv1a1.JSONPatchOperation{Op: "add"}); err == nil || !strings.Contains(err.Error(), "path or jsonPath") {
		t.Errorf("no path: %v", err)
	}
}
