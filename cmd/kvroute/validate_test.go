//go:build !metricsonly

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// shippedConfigs are the files a user starts from: every manifest and the
// example plugin configurations.
func shippedConfigs(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, dir := range []string{"../../envoy", "../../testdata/plugin-config"} {
		fs, err := validateFiles([]string{dir})
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, fs...)
	}
	if len(files) < 10 {
		t.Fatalf("found only %v", files)
	}
	return files
}

func TestValidateShippedFiles(t *testing.T) {
	files := shippedConfigs(t)
	out, err := runCLI(t, append([]string{"validate"}, files...)...)
	if err != nil {
		t.Fatalf("kvroute validate on the shipped files: %v\n%s", err, out)
	}
	if n := strings.Count(out, ": ok\n"); n != len(files) {
		t.Fatalf("%d files ok of %d:\n%s", n, len(files), out)
	}
}

// edit replaces old (which must occur) with new in data and returns the
// 1-based line the replacement starts on.
func edit(t *testing.T, data, old, new string) (string, int) {
	t.Helper()
	i := strings.Index(data, old)
	if i < 0 {
		t.Fatalf("anchor %q not found: update the test", old)
	}
	return data[:i] + new + data[i+len(old):], strings.Count(data[:i], "\n") + 1
}

// TestValidateBrokenCopies breaks copies of shipped files in two places
// each and checks that validate fails and reports both, each at the line
// of the edit with the field's path.
func TestValidateBrokenCopies(t *testing.T) {
	type breakage struct{ old, new, path string }
	cases := []struct {
		file   string
		breaks []breakage
	}{
		{"../../envoy/standalone/envoy.yaml", []breakage{
			{"per_connection_buffer_limit_bytes: 33554432\n    filter_chains", "per_connection_buffer_limits: 33554432\n    filter_chains", "static_resources.listeners[0].per_connection_buffer_limits"},
			{`"strategy": "kv_cache_aware"`, `"strategy": "kv_cache_awesome"`, "configuration.value.strategy"},
			{"connect_timeout: 2s", "connect_timeout: -2s", "connect_timeout"},
		}},
		{"../../envoy/istio/envoyfilter.yaml", []breakage{
			{"  workloadSelector:", "  workloadSelectors:", "spec.workloadSelectors"},
			{"initial_fetch_timeout: 0s", "initial_fetch_timeout: soon", "spec.configPatches[3].patch.value.config_discovery.config_source.initial_fetch_timeout"},
		}},
		{"../../envoy/istio/wasmplugin-header-only.yaml", []breakage{
			{"pluginName: kvroute.router", "plugin_nam: kvroute.router", "spec.plugin_nam"},
		}},
		{"../../envoy/envoy-gateway/kvroute.yaml", []breakage{
			{"    endpointOverride:", "    endpointOverrides:", "spec.loadBalancer.endpointOverrides"},
			{"maxBodyBytes: 16777216", "maxBodyBytes: -1", "spec.wasm[0].config.maxBodyBytes"},
			{"        type: STRICT_DNS", "        type: STRICTER_DNS", "operation.value.type"},
		}},
		{"../../envoy/kubernetes/metrics.yaml", []breakage{
			{"      serviceAccountName: kvroute-metrics", "      serviceAccount_name: kvroute-metrics", "spec.template.spec.serviceAccount_name"},
			{"          secretName: kvroute-state-token", "          secretName: kvroute-token", "spec.template.spec.volumes[0].secret.secretName"},
		}},
		{"../../testdata/plugin-config/router-full.json", []breakage{
			{`"fallbacks": 2`, `"fallbacks": 99`, "fallbacks"},
			{`"maxBodyBytes": 4194304`, `"maxBodyBytes": 0`, "maxBodyBytes"},
		}},
	}
	dir := t.TempDir()
	for _, c := range cases {
		t.Run(filepath.Base(c.file), func(t *testing.T) {
			data, err := os.ReadFile(c.file)
			if err != nil {
				t.Fatal(err)
			}
			broken := string(data)
			lines := make([]int, len(c.breaks))
			for _, b := range c.breaks {
				broken, _ = edit(t, broken, b.old, b.new)
			}
			for i, b := range c.breaks {
				_, lines[i] = edit(t, broken, b.new, b.new)
			}
			copyPath := filepath.Join(dir, filepath.Base(c.file))
			if err := os.WriteFile(copyPath, []byte(broken), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := runCLI(t, "validate", copyPath)
			if err == nil {
				t.Fatalf("validate passed a broken copy:\n%s", out)
			}
			for i, b := range c.breaks {
				want := regexp.MustCompile(fmt.Sprintf(`(?m)^%s:%d: \S*%s: `, regexp.QuoteMeta(copyPath), lines[i], regexp.QuoteMeta(b.path)))
				if !want.MatchString(out) {
					t.Errorf("no problem at line %d naming %s; output:\n%s", lines[i], b.path, out)
				}
			}
		})
	}
}

// TestValidateAcceptsAUsersEdit: the checks hold the files' structure, not
// their literal addresses and names. A user's consistent edit (other
// engine addresses, service names, namespace, ports, header and token
// variable) passes.
func TestValidateAcceptsAUsersEdit(t *testing.T) {
	edits := []struct{ re, to string }{
		{`10\.0\.0\.`, "172.20.3."},
		{`\bvllm(\.|-prefill)`, "engine$1"},
		{`name: vllm\b`, "name: engine"},
		{`(^|[^\w-])llm([^\w-]|$)`, "${1}inference${2}"},
		{`\b8000\b`, "8080"},
		{`\b9002\b`, "9102"},
		{`x-gateway-destination-endpoint`, "x-route-to"},
		{`KVROUTE_STATE_TOKEN`, "ROUTER_TOKEN"},
	}
	dir := t.TempDir()
	for _, f := range shippedConfigs(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := string(data)
		for _, e := range edits {
			s = regexp.MustCompile(e.re).ReplaceAllString(s, e.to)
		}
		if s == string(data) {
			continue
		}
		p := filepath.Join(dir, filepath.Base(filepath.Dir(f))+"-"+filepath.Base(f))
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := runCLI(t, "validate", p); err != nil {
			t.Errorf("%s with other addresses and names: %v\n%s", f, err, out)
		}
	}
}
