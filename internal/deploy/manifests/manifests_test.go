package manifests

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	// Alone, the policy lacks the rest of the wiring (Check says so); its
	// plugin is still found and checked.
	res, _ := Check("p.yaml", []byte(doc))
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
		"unknown k8s field":  {"apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a}\nsecret: []\n", `yaml:4: secret: unknown field`},
		"istio spec field":   {"apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {name: a}\nspec: {urll: x}\n", "urll"},
		"wasm plugin no url": {"apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {name: a}\nspec: {pluginName: x}\n", "spec.url"},
		"envoy bad duration": {"static_resources: {clusters: [{name: a, connect_timeout: soon}]}\n", `yaml:1: static_resources.clusters[0].connect_timeout: invalid google.protobuf.Duration value "soon"`},
		"envoy unknown":      {"static_resources: {clusterz: []}\n", "clusterz"},
		"empty":              {" \n", "the file is empty"},
		"k8s type, no index": {"apiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec:\n  ports:\n  - name: x\n    port: eighty\n", "yaml:7: spec.ports.port: json: cannot unmarshal string"},
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

// TestEveryProblemIsReported: one run names every problem of a file, each
// at its line and path: several unknown fields and bad values in one
// decode, and a rule Envoy enforces inside a typed_config (which
// ValidateAll alone does not enter).
func TestEveryProblemIsReported(t *testing.T) {
	doc := `static_resources:
  listeners:
  - name: l
    address: {socket_address: {address: 0.0.0.0, port_value: 8080}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ""
          route_config: {name: r}
          http_filters:
          - name: router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: a
    connect_timeout: soon
    lb_polcy: ROUND_ROBIN
  - name: b
    connect_timeout: 1s
    per_connection_buffer_limit: 5
`
	_, err := Check("b.yaml", []byte(doc))
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("error %v is not Problems", err)
	}
	want := []string{
		"b.yaml:10: static_resources.listeners[0].filter_chains[0].filters[0].typed_config.stat_prefix: value length must be at least 1 runes",
		`b.yaml:17: static_resources.clusters[0].connect_timeout: invalid google.protobuf.Duration value "soon"`,
		`b.yaml:18: static_resources.clusters[0].lb_polcy: unknown field "lb_polcy"`,
		`b.yaml:21: static_resources.clusters[1].per_connection_buffer_limit: unknown field "per_connection_buffer_limit"`,
	}
	var got []string
	for _, p := range ps {
		got = append(got, p.String())
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestCheckTogether: a deployment split across files fails file by file
// (each lacks what the other holds) and passes checked together, with
// problems mapped back to each file's own lines.
func TestCheckTogether(t *testing.T) {
	data, err := os.ReadFile("../../../envoy/envoy-gateway/kvroute.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cut := strings.Index(string(data), "---\napiVersion: gateway.envoyproxy.io/v1alpha1\nkind: EnvoyExtensionPolicy")
	if cut < 0 {
		t.Fatal("the shipped Envoy Gateway file has no EnvoyExtensionPolicy document: update the test")
	}
	dir := t.TempDir()
	a, b := filepath.Join(dir, "gateway.yaml"), filepath.Join(dir, "policies.yaml")
	os.WriteFile(a, data[:cut], 0o644)
	os.WriteFile(b, data[cut:], 0o644)
	if _, err := CheckFile(b); err == nil {
		t.Fatal("the policies alone passed: the split proves nothing")
	}
	if _, err := CheckTogether([]string{a, b}); err != nil {
		t.Fatalf("together: %v", err)
	}
	// A problem in the second file is reported at its line there.
	broken := strings.Replace(string(data[cut:]), "maxBodyBytes: 16777216", "maxBodyBytes: -1", 1)
	os.WriteFile(b, []byte(broken), 0o644)
	line := strings.Count(broken[:strings.Index(broken, "maxBodyBytes: -1")], "\n") + 1
	_, err = CheckTogether([]string{a, b})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%s:%d: spec.wasm[0].config.maxBodyBytes:", filepath.ToSlash(b), line)) {
		t.Fatalf("error %v does not point at %s:%d", err, b, line)
	}
}

// TestNoTestHostDependency: `kvroute validate` ships in the CLI, so the
// checker must not pull in a test host.
func TestNoTestHostDependency(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/kvroute/kvroute/internal/") && (strings.HasSuffix(dep, "host") || strings.Contains(dep, "test")) {
			t.Errorf("internal/deploy/manifests depends on %s", dep)
		}
	}
}
