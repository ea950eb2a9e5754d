package envoy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"

	"github.com/kvroute/kvroute/filter/statnames"
	"github.com/kvroute/kvroute/internal/deploy/manifests"
	"github.com/kvroute/kvroute/internal/metricsvc"
	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
	sigsyaml "sigs.k8s.io/yaml"
)

const dashboardFile = "../deploy/grafana/kvroute.json"

// emittedStats runs the module with the shipped standalone bootstrap (router
// and pd, with admission on) through one routed request, and returns the
// Prometheus name of every stat it defined, as Envoy exposes it with the
// bootstrap's stats_tags: the tag-extracted name without "wasmcustom.",
// sanitized. The names come from the running code, so a counter added
// anywhere in the filters is seen.
func emittedStats(t *testing.T) (names map[string]bool, tags map[string]bool, raw []string) {
	t.Helper()
	module := testenv.Module(t)
	const file = "standalone/envoy.yaml"
	b := &bootstrapv3.Bootstrap{}
	if err := manifests.DecodeEnvoyYAML(file, read(t, file), b); err != nil {
		t.Fatal(err)
	}
	d1, d2, prefill := newEngine(t), newEngine(t), newEngine(t)
	cfg, err := wasmhost.ConfigFromBootstrap(b, "inference", map[string]string{"10.0.0.11:8000": d1.addr(), "10.0.0.12:8000": d2.addr(), "10.0.0.21:8000": prefill.addr()})
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Filters {
		var c map[string]any
		if err := json.Unmarshal([]byte(cfg.Filters[i].Configuration), &c); err != nil {
			t.Fatal(err)
		}
		c["admission"] = map[string]any{"maxHeld": 16}
		js, _ := json.Marshal(c)
		cfg.Filters[i].Configuration = string(js)
	}
	cfg.Module = module
	h, url := wasmhosttest.Start(t, cfg)
	if code, resp := post(t, url+"/v1/chat/completions", `{"model":"llama-3-8b","messages":[{"role":"user","content":"hello"}]}`, nil); code != 200 {
		t.Fatalf("request: %d %s", code, resp)
	}
	names, tags = map[string]bool{}, map[string]bool{}
	for _, m := range h.Metrics() {
		raw = append(raw, m.Name)
		name, tagged := envoyPromName(m.Name, b.GetStatsConfig().GetStatsTags())
		for _, tg := range tagged {
			tags[tg] = true
		}
		names[name] = true
		if m.Type == wasmhost.Histogram {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[name+s] = true
			}
		}
	}
	return names, tags, raw
}

// envoyPromName is what Envoy's Prometheus output calls a stat a Wasm
// module defined as name: the tag specifiers run on the full name in
// order, each removing its first capture group and taking its second as the
// tag's value; the registered namespace "wasmcustom." is then stripped and
// the rest sanitized, with no "envoy_" prefix.
func envoyPromName(name string, specs []*metricsv3.TagSpecifier) (string, []string) {
	full := statnames.Namespace + name
	var tags []string
	for _, s := range specs {
		re, err := regexp.Compile(s.GetRegex())
		if s.GetRegex() == "" || err != nil {
			continue
		}
		if m := re.FindStringSubmatchIndex(full); len(m) >= 6 && m[2] >= 0 && m[4] >= 0 {
			full = full[:m[2]] + full[m[3]:]
			tags = append(tags, s.GetTagName())
		}
	}
	full = strings.TrimPrefix(full, statnames.Namespace)
	return regexp.MustCompile(`[^a-zA-Z0-9_]`).ReplaceAllString(full, "_"), tags
}

// TestStatsAggregate: with the shipped tag extraction, no stat name keeps a
// value: every TAG=.=VALUE;.; part is a declared tag the bootstrap
// extracts, and what varies by profile, band or reason is one stat.
func TestStatsAggregate(t *testing.T) {
	names, tags, raw := emittedStats(t)
	for n := range names {
		if strings.Contains(n, "___") {
			t.Errorf("%s keeps a value in its name: a tag the shipped stats_tags do not extract", n)
		}
	}
	for _, tag := range statnames.Tags {
		if !tags[tag] {
			t.Errorf("no stat carried the tag %s through one request: the check proves nothing for it", tag)
		}
	}
	for _, want := range []string{"kvroute_router_profile_requests", "kvroute_router_requests_rejected", "kvroute_pd_fallbacks",
		"kvroute_router_admission_held", "kvroute_router_admission_held_total", "kvroute_router_admission_wait_us_bucket",
		"kvroute_router_prompt_tokens", "kvroute_router_feedback_prompt_tokens", "kvroute_router_predicted_cached_tokens", "kvroute_router_confirmed_cached_tokens"} {
		if !names[want] {
			t.Errorf("%s is not emitted (the module defined %v)", want, raw)
		}
	}
	for _, n := range raw {
		if !strings.HasPrefix(n, statnames.Router) && !strings.HasPrefix(n, statnames.PD) {
			t.Errorf("%s is outside kvroute.router. and kvroute.pd.", n)
		}
		if strings.HasSuffix(n, "_ms") || strings.Contains(n, "_ms.") {
			t.Errorf("%s is in milliseconds: kvroute's durations are in microseconds (_us)", n)
		}
	}
}

// TestDashboardQueriesWhatTheCodeEmits: every metric and label the Grafana
// dashboard queries is one the filters define (run, not listed by hand) or
// the metrics service registers.
func TestDashboardQueriesWhatTheCodeEmits(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Type    string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	names, tags, _ := emittedStats(t)
	labels := map[string]bool{"le": true}
	for tg := range tags {
		labels[tg] = true
	}
	for _, f := range metricsvc.Families() {
		for _, s := range []string{"", "_bucket", "_sum", "_count"} {
			names[f.Name+s] = true
		}
		for _, l := range f.Labels {
			labels[l] = true
		}
	}
	queried := 0
	onDashboard := map[string]bool{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			metrics, used := promqlRefs(tg.Expr)
			if len(metrics) == 0 {
				t.Errorf("panel %q: %q queries no metric", p.Title, tg.Expr)
			}
			for _, m := range metrics {
				queried++
				onDashboard[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")] = true
				if !names[m] {
					t.Errorf("panel %q queries %s, which no code emits", p.Title, m)
				}
			}
			for _, l := range used {
				if !labels[l] {
					t.Errorf("panel %q uses the label %s, which no emitted metric carries", p.Title, l)
				}
			}
		}
	}
	// The other way round: every kvroute stat and service metric has a
	// panel, so a counter added to the code shows up for operators.
	var families []string
	for n := range names {
		if strings.HasPrefix(n, "kvroute_") && !strings.HasSuffix(n, "_bucket") && !strings.HasSuffix(n, "_sum") && !strings.HasSuffix(n, "_count") {
			families = append(families, n)
		}
	}
	sort.Strings(families)
	for _, n := range families {
		if !onDashboard[n] {
			t.Errorf("%s is emitted but on no panel of %s: add it to a panel (or a new one)", n, dashboardFile)
		}
	}
	if queried < 20 {
		t.Fatalf("only %d metric references found in %s: the parser or the file is wrong", queried, dashboardFile)
	}
}

var (
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
)

// promqlRefs returns the metric names and label names a PromQL expression
// uses (Grafana variables taken out): identifiers inside {...} or after
// by/without are labels; identifiers followed by "(" are functions.
func promqlRefs(expr string) (metrics, labels []string) {
	expr = strings.NewReplacer("$__rate_interval", "5m", "$sel", "").Replace(expr)
	depthBrace, inGroup := 0, false
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"':
			j := strings.IndexByte(expr[i+1:], '"')
			if j < 0 {
				return metrics, labels
			}
			i += j + 2
			continue
		case c == '{':
			depthBrace++
		case c == '}':
			depthBrace--
		case c == ')':
			inGroup = false
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			i += max(j, 0) + 1
			continue
		}
		loc := promIdent.FindStringIndex(expr[i:])
		if loc == nil || loc[0] != 0 || (i > 0 && (isIdentByte(expr[i-1]) || expr[i-1] == '.')) {
			i++
			continue
		}
		word := expr[i : i+loc[1]]
		i += loc[1]
		rest := strings.TrimLeft(expr[i:], " ")
		switch {
		case depthBrace > 0 || inGroup:
			labels = append(labels, word)
		case slices.Contains(promKeywords, word):
			if word == "by" || word == "without" {
				inGroup = strings.HasPrefix(rest, "(")
			}
		case strings.HasPrefix(rest, "(") || strings.HasPrefix(rest, "by") || strings.HasPrefix(rest, "without"):
			// a function, or an aggregation with its grouping first
		default:
			metrics = append(metrics, word)
		}
	}
	sort.Strings(metrics)
	return slices.Compact(metrics), labels
}

func isIdentByte(b byte) bool {
	return b == '_' || b == ':' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

func TestPromqlRefs(t *testing.T) {
	m, l := promqlRefs(`histogram_quantile(0.99, sum by (le) (rate(kvroute_x_bucket{$sel}[$__rate_interval]))) / sum by (kvroute_band) (kvroute_y{a="b"})`)
	if fmt.Sprint(m) != "[kvroute_x_bucket kvroute_y]" || fmt.Sprint(l) != "[le kvroute_band a]" {
		t.Fatalf("metrics %v labels %v", m, l)
	}
}

// TestIstioStatsAnnotations: the shipped patch of the Istio gateway's
// Deployment (examples/istio/gateway-stats-patch.yaml) extracts every
// kvroute tag and gives its histograms the buckets the shipped bootstraps
// give them (an Istio gateway's bootstrap is in no manifest, so its pod
// annotations are what ships), and the Istio guide applies that file.
func TestIstioStatsAnnotations(t *testing.T) {
	const patchFile = "examples/istio/gateway-stats-patch.yaml"
	if guide := string(read(t, "../examples/istio/README.md")); !strings.Contains(guide, "--patch-file "+patchFile) {
		t.Errorf("examples/istio/README.md does not apply %s", patchFile)
	}
	var p struct {
		Spec struct {
			Template struct {
				Metadata struct{ Annotations map[string]string }
			}
		}
	}
	if err := sigsyaml.UnmarshalStrict(read(t, "../"+patchFile), &p); err != nil {
		t.Fatalf("%s: %v", patchFile, err)
	}
	ann := p.Spec.Template.Metadata.Annotations
	var proxy struct{ ExtraStatTags []string }
	if err := json.Unmarshal([]byte(ann["proxy.istio.io/config"]), &proxy); err != nil {
		t.Fatalf("proxy.istio.io/config: %v", err)
	}
	if !slices.Equal(proxy.ExtraStatTags, statnames.Tags) {
		t.Errorf("extraStatTags %v, want the filters' tags %v", proxy.ExtraStatTags, statnames.Tags)
	}
	var buckets map[string][]float64
	if err := json.Unmarshal([]byte(ann["sidecar.istio.io/statsHistogramBuckets"]), &buckets); err != nil {
		t.Fatalf("sidecar.istio.io/statsHistogramBuckets: %v", err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := manifests.DecodeEnvoyYAML("standalone/envoy.yaml", read(t, "standalone/envoy.yaml"), b); err != nil {
		t.Fatal(err)
	}
	want := b.GetStatsConfig().GetHistogramBucketSettings()[0]
	if got := buckets[want.GetMatch().GetPrefix()]; !slices.Equal(got, want.GetBuckets()) {
		t.Errorf("Istio buckets for %q = %v, want the standalone bootstrap's %v", want.GetMatch().GetPrefix(), got, want.GetBuckets())
	}
}
