// Package envoy_test runs on every manifest under envoy/ the checks of
// `kvroute validate` (internal/deploy/manifests.Check): the real API types, the
// plugin configuration embedded in each through the filter's own validator
// (config), and the facts kvroute depends on: the header the filter
// writes is the header the cluster reads, the buffer limit exceeds the
// largest body the filter accepts, both filters share one VM, body routing
// has the setting it needs.
package envoy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/internal/deploy/manifests"
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

// TestManifests runs every check of `kvroute validate` on every manifest.
func TestManifests(t *testing.T) {
	for _, name := range shipped {
		t.Run(name, func(t *testing.T) {
			res, err := manifests.Check(name, read(t, name))
			if err != nil {
				t.Fatal(err)
			}
			if name != "kubernetes/metrics.yaml" && len(res.Plugins) == 0 {
				t.Fatal("no kvroute plugin configuration found")
			}
			if err := secretsArePlaceholders(res); err != nil {
				t.Fatal(err)
			}
		})
	}
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
		{"standalone/envoy.yaml", "- name: kvroute_prefill\n    type: STATIC\n    connect_timeout: 2s", "- name: kvroute_prefill\n    type: STATIC\n    connect_timeout: -2s", "clusters[1].connect_timeout"},
		{"standalone/envoy.yaml", "port_value: 9002", "port_value: 99002", "socket_address.port_value"},
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
		// The stats: kvroute's tags extracted, its µs histograms given buckets.
		{"standalone/envoy.yaml", "  - {tag_name: kvroute_band, regex: '(kvroute_band=\\.=(.*?);\\.;)'}\n", "", "kvroute_band"},
		{"standalone/envoy.yaml", ", 30000000, 60000000]", "]", "histogram_bucket_settings"},
		{"envoy-gateway/kvroute.yaml", "regex: '(kvroute_reason=\\.=(.*?);\\.;)'", "regex: '(kvroute_reason=(.*?);)'", "kvroute_reason"},
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
				err = secretsArePlaceholders(res)
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
	heavy := []string{"github.com/envoyproxy/", "istio.io/", "k8s.io/", "sigs.k8s.io/", "github.com/google/go-containerregistry", "google.golang.org/protobuf", "github.com/kvroute/kvroute/internal/deploy/manifests", "github.com/kvroute/kvroute/internal/deploy/oci"}
	for _, dep := range deps {
		for _, h := range heavy {
			if strings.HasPrefix(dep, h) {
				t.Errorf("the Wasm module depends on %s", dep)
			}
		}
	}
}

// secretsArePlaceholders: a shipped Secret carries a placeholder the user
// replaces, never what looks like a real token (a rule for the files in
// this repository, not for a user's, which `kvroute validate` checks).
func secretsArePlaceholders(res *manifests.Result) error {
	for _, o := range res.Objects {
		s, ok := o.Value.(*corev1.Secret)
		if !ok {
			continue
		}
		for k, v := range s.StringData {
			if !strings.Contains(v, "REPLACE") {
				return fmt.Errorf("%s: stringData.%s must be a REPLACE-ME placeholder, never a real token", o.Where, k)
			}
		}
		if len(s.Data) > 0 {
			return fmt.Errorf("%s: data: ship the token as a stringData placeholder, never encoded", o.Where)
		}
	}
	return nil
}
