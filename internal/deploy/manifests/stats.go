package manifests

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/filter/statnames"
)

// minTopBucket is the largest bucket kvroute's histograms need: they are in
// microseconds, and an admission wait or a prefill can last a minute.
// Envoy's default buckets stop at 3,600,000 (3.6 s in µs).
const minTopBucket = 60_000_000

// checkStats: a deployment whose bootstrap the file sets (a standalone
// bootstrap, an Envoy Gateway EnvoyProxy) extracts every kvroute tag and
// gives kvroute's microsecond histograms buckets that reach a minute. An
// Istio gateway's bootstrap is not in its manifests: extraStatTags and the
// histogram buckets are set on the gateway's pods (docs/operations.md).
func checkStats(r *report, res *Result) {
	for _, er := range res.Envoy {
		if b, ok := er.Message.(*bootstrapv3.Bootstrap); ok {
			for _, fp := range statsProblems(b.GetStatsConfig()) {
				r.add(er.Doc, joinField("stats_config", fp.path), "%s", fp.msg)
			}
		}
	}
	for _, o := range res.Objects {
		ep, ok := o.Value.(*egv1a1.EnvoyProxy)
		if !ok {
			continue
		}
		b, at := egBootstrap(r, o, ep)
		if b == nil {
			continue
		}
		for _, fp := range statsProblems(b.GetStatsConfig()) {
			r.add(o.Doc, at, "in the bootstrap Envoy Gateway would run, stats_config.%s: %s", fp.path, fp.msg)
		}
	}
}

// egDefaultStats is the part of Envoy Gateway's default bootstrap that its
// patches and merges build on: a stats_config with a stats_tags list.
const egDefaultStats = `{"stats_config":{"use_all_default_tags":true,"stats_tags":[{"tag_name":"priority","regex":"circuit_breakers\\.((.+?)\\.).+"}]}}`

// egBootstrap returns what an EnvoyProxy makes of Envoy Gateway's default
// bootstrap, as far as stats go, and the path its problems are reported at.
func egBootstrap(r *report, o Object, ep *egv1a1.EnvoyProxy) (*bootstrapv3.Bootstrap, string) {
	at := "spec.bootstrap"
	bs := ep.Spec.Bootstrap
	b := &bootstrapv3.Bootstrap{}
	if bs == nil {
		decodeProto([]byte(egDefaultStats), b)
		return b, at
	}
	typ := egv1a1.BootstrapTypeReplace
	if bs.Type != nil {
		typ = *bs.Type
	}
	var js []byte
	switch typ {
	case egv1a1.BootstrapTypeJSONPatch:
		js = []byte(egDefaultStats)
		for i, op := range bs.JSONPatches {
			out, err := applyJSONPatch(index(at+".jsonPatches", i), js, op)
			if err != nil {
				r.addErr(o.Doc, "", err)
				return nil, at
			}
			js = out
		}
	case egv1a1.BootstrapTypeMerge, egv1a1.BootstrapTypeReplace:
		if bs.Value == nil {
			r.add(o.Doc, at+".value", "is required for type %s", typ)
			return nil, at
		}
		v, err := yaml.YAMLToJSONStrict([]byte(*bs.Value))
		if err != nil {
			r.add(o.Doc, at+".value", "%v", err)
			return nil, at
		}
		js = v
		if typ == egv1a1.BootstrapTypeMerge {
			// A merge appends to the default lists: the default's tags stay.
			if probs := decodeProto(js, b); len(probs) == 0 {
				base := &bootstrapv3.Bootstrap{}
				decodeProto([]byte(egDefaultStats), base)
				b.StatsConfig = mergeStats(base.GetStatsConfig(), b.GetStatsConfig())
				js = nil
			}
		}
	default:
		r.add(o.Doc, at+".type", "%q: want JSONPatch, Merge or Replace", typ)
		return nil, at
	}
	if js != nil {
		for _, fp := range envoyProblems(js, b) {
			r.add(o.Doc, at, "the bootstrap Envoy Gateway would run is invalid at %s: %s", fp.path, fp.msg)
		}
	}
	return b, at
}

func mergeStats(base, add *metricsv3.StatsConfig) *metricsv3.StatsConfig {
	out := &metricsv3.StatsConfig{UseAllDefaultTags: base.GetUseAllDefaultTags()}
	out.StatsTags = append(append(out.StatsTags, base.GetStatsTags()...), add.GetStatsTags()...)
	out.HistogramBucketSettings = append(append(out.HistogramBucketSettings, base.GetHistogramBucketSettings()...), add.GetHistogramBucketSettings()...)
	return out
}

// statsProblems checks one stats_config against kvroute's stat names.
func statsProblems(sc *metricsv3.StatsConfig) []fieldProblem {
	var out []fieldProblem
	for _, tag := range statnames.Tags {
		name := statnames.Namespace + statnames.Tagged(statnames.Router, tag, "v-1", "x")
		if !extractsTag(sc.GetStatsTags(), tag, name, "v-1", statnames.Namespace+statnames.Router+"x") {
			out = append(out, fieldProblem{"stats_tags", fmt.Sprintf(
				"no entry extracts kvroute's tag %s ({tag_name: %s, regex: '%s'}): each of its values would be a separate stat", tag, tag, statnames.TagRegex(tag))})
		}
	}
	hist := statnames.Namespace + statnames.Router + "decision_us"
	for _, h := range sc.GetHistogramBucketSettings() {
		if matches(h.GetMatch(), hist) {
			if b := h.GetBuckets(); len(b) == 0 || slices.Max(b) < minTopBucket {
				return append(out, fieldProblem{"histogram_bucket_settings", fmt.Sprintf(
					"the buckets for %s stop below %d: kvroute's histograms are in microseconds and an admission wait or a prefill can last a minute", hist, minTopBucket)})
			}
			return out
		}
	}
	return append(out, fieldProblem{"histogram_bucket_settings", fmt.Sprintf(
		"no buckets for kvroute's histograms (match: {prefix: %skvroute.}): they are in microseconds, and Envoy's default buckets stop at 3.6 s", statnames.Namespace)})
}

// extractsTag reports whether Envoy, running the tag specifiers in order,
// extracts tag with value want from name and leaves the name rest: the
// first capture group is removed, the second is the value (Envoy's rule).
func extractsTag(specs []*metricsv3.TagSpecifier, tag, name, want, rest string) bool {
	for _, s := range specs {
		if s.GetTagName() != tag || s.GetRegex() == "" {
			continue
		}
		re, err := regexp.Compile(s.GetRegex())
		if err != nil {
			continue
		}
		m := re.FindStringSubmatchIndex(name)
		if len(m) < 6 || m[2] < 0 || m[4] < 0 {
			continue
		}
		if name[m[4]:m[5]] == want && name[:m[2]]+name[m[3]:] == rest {
			return true
		}
	}
	return false
}

// matches is a StringMatcher's test, for the patterns a stats config uses.
func matches(m *matcherv3.StringMatcher, s string) bool {
	if m.GetIgnoreCase() {
		s = strings.ToLower(s)
	}
	low := func(p string) string {
		if m.GetIgnoreCase() {
			return strings.ToLower(p)
		}
		return p
	}
	switch {
	case m.GetExact() != "":
		return s == low(m.GetExact())
	case m.GetPrefix() != "":
		return strings.HasPrefix(s, low(m.GetPrefix()))
	case m.GetSuffix() != "":
		return strings.HasSuffix(s, low(m.GetSuffix()))
	case m.GetContains() != "":
		return strings.Contains(s, low(m.GetContains()))
	case m.GetSafeRegex() != nil:
		re, err := regexp.Compile("^(?:" + m.GetSafeRegex().GetRegex() + ")$")
		return err == nil && re.MatchString(s)
	}
	return false
}
