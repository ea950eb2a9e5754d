//go:build !metricsonly

package main

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"

	"github.com/kvroute/kvroute/internal/deploy/manifests"
)

const chartDir = "../../deploy/helm/kvroute"

// helmVariants are the chart's deployments: each gateway type, with and
// without prefill/decode disaggregation.
var helmVariants = map[string]map[string]any{
	"istio": {"state": map[string]any{"token": "t0ken"}},
	"istio-pd": {"state": map[string]any{"token": "t0ken"},
		"engines": map[string]any{"prefillService": "vllm-prefill", "namespace": "engines"}},
	"envoy-gateway": {"state": map[string]any{"existingSecret": "my-token"},
		"gateway": map[string]any{"type": "envoyGateway", "envoyGateway": map[string]any{"service": "envoy-llm-kvroute.envoy-gateway-system.svc.cluster.local"}}},
	"envoy-gateway-pd": {"state": map[string]any{"token": "t0ken"},
		"engines": map[string]any{"prefillService": "vllm-prefill", "protocol": "sglang"},
		"gateway": map[string]any{"type": "envoyGateway", "envoyGateway": map[string]any{"service": "envoy-llm-kvroute.envoy-gateway-system.svc.cluster.local"}},
		"router":  map[string]any{"extraConfig": map[string]any{"admission": map[string]any{"maxHeld": 64}}}},
	"metrics-only": {"state": map[string]any{"token": "t0ken"},
		"gateway": map[string]any{"type": "none"},
		"metrics": map[string]any{"extraGateways": []any{"http://gw.example.svc.cluster.local:9002/.kvroute/v1/state"}}},
}

// renderChart renders the chart with vals as `helm template` does, and
// returns the manifests in one multi-document YAML.
func renderChart(t *testing.T, ch *chart.Chart, vals map[string]any) (string, error) {
	t.Helper()
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "kvroute", Namespace: "llm", IsInstall: true}, nil)
	if err != nil {
		return "", err
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		if strings.HasSuffix(n, ".yaml") && strings.TrimSpace(out[n]) != "" {
			fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", n, out[n])
		}
	}
	return b.String(), nil
}

// TestHelmChart lints the chart with Helm's own linter and renders each
// variant, then runs on the rendered manifests the checks the shipped ones
// pass (`kvroute validate`) and parses the metrics service's arguments
// with the command's flags.
func TestHelmChart(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for name, vals := range helmVariants {
		t.Run(name, func(t *testing.T) {
			l := lint.All(chartDir, vals, "llm", false)
			for _, m := range l.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				}
			}
			out, err := renderChart(t, ch, vals)
			if err != nil {
				t.Fatal(err)
			}
			if vals["state"].(map[string]any)["existingSecret"] != nil {
				// The user's own Secret, checked with the rendered
				// manifests as `kvroute validate --together` would.
				out += "---\napiVersion: v1\nkind: Secret\nmetadata: {name: my-token, namespace: llm}\nstringData: {token: s3cr3t}\n"
			}
			res, err := manifests.Check("helm template ("+name+")", []byte(out))
			if err != nil {
				t.Fatalf("%v\n\nrendered:\n%s", err, out)
			}
			checkMetricsArgs(t, res)
			if name != "metrics-only" && len(res.Plugins) == 0 {
				t.Error("no plugin configuration rendered")
			}
		})
	}
}

// TestHelmChartRefusals: values that would make a broken deployment fail
// at render time or in the checks, naming what to fix.
func TestHelmChartRefusals(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		vals map[string]any
		want string
	}{
		"no token": {map[string]any{}, "set state.token"},
		"eg without its service": {map[string]any{"state": map[string]any{"token": "t"}, "gateway": map[string]any{"type": "envoyGateway"}},
			"gateway.envoyGateway.service"},
		"nowhere to push": {map[string]any{"state": map[string]any{"token": "t"}, "gateway": map[string]any{"type": "none"}}, "metrics.extraGateways"},
		"buffer below the body": {map[string]any{"state": map[string]any{"token": "t"}, "gateway": map[string]any{"bufferLimitBytes": 1048576}},
			"connection buffer limit 1048576 is below maxBodyBytes"},
		"bad strategy": {map[string]any{"state": map[string]any{"token": "t"}, "router": map[string]any{"strategy": "kv_cache_awesome"}},
			`configuration.value.strategy: unknown strategy "kv_cache_awesome"`},
		"eg bad extra config": {map[string]any{"state": map[string]any{"token": "t"}, "router": map[string]any{"extraConfig": map[string]any{"fallbacks": 99}},
			"gateway": map[string]any{"type": "envoyGateway", "envoyGateway": map[string]any{"service": "gw"}}},
			"spec.wasm[0].config.fallbacks"},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := renderChart(t, ch, c.vals)
			if err == nil {
				_, err = manifests.Check("helm template", []byte(out))
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to name %q", err, c.want)
			}
		})
	}
}

// helmOpaque are the values whose maps are one setting, documented whole.
var helmOpaque = []string{"router.extraConfig", "gateway.istio.selector", "metrics.resources"}

// TestHelmValuesDocumented: every value has a comment in values.yaml and a
// row in docs/helm.md, and the doc lists no value the chart lacks.
func TestHelmValuesDocumented(t *testing.T) {
	vals, err := chartutil.ReadValuesFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			key := strings.TrimPrefix(prefix+"."+k, ".")
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 && !slices.Contains(helmOpaque, key) {
				walk(key, sub)
				continue
			}
			keys = append(keys, key)
		}
	}
	walk("", vals)
	doc, err := os.ReadFile("../../docs/helm.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := regexp.MustCompile("(?m)^\\| `([a-zA-Z0-9.]+)` \\|").FindAllStringSubmatch(string(doc), -1)
	documented := map[string]bool{}
	for _, r := range rows {
		documented[r[1]] = true
	}
	for _, k := range keys {
		if !documented[k] {
			t.Errorf("value %s has no row in docs/helm.md", k)
		}
		delete(documented, k)
	}
	for k := range documented {
		t.Errorf("docs/helm.md documents %s, which values.yaml does not have", k)
	}
	// A comment on the line before each key of values.yaml.
	raw, err := os.ReadFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	keyLine := regexp.MustCompile(`^(\s*)([A-Za-z]\w*):`)
	var path []string
	for i, l := range lines {
		m := keyLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		depth := len(m[1]) / 2
		path = append(path[:min(depth, len(path))], m[2])
		key := strings.Join(path, ".")
		if !slices.Contains(keys, key) && !slices.ContainsFunc(keys, func(k string) bool { return strings.HasPrefix(k, key+".") }) {
			continue // inside an opaque value
		}
		if i == 0 || !strings.HasPrefix(strings.TrimSpace(lines[i-1]), "#") {
			t.Errorf("values.yaml:%d: %s has no comment above it", i+1, key)
		}
	}
}
