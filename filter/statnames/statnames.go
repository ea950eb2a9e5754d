// Package statnames names the statistics the kvroute filters define in
// Envoy, and the tags an operator aggregates them by.
//
// A proxy-wasm module defines a stat by name only; Envoy puts it under
// "wasmcustom." and exposes it without that prefix (Prometheus:
// kvroute_router_requests_routed). A value that varies (a profile, a
// priority band, a fallback reason) is carried in the name the way Istio's
// own stats carry theirs, TAG=.=VALUE;.; in the middle of the name, and is
// extracted into a tag by a stats_tags entry with TagRegex: the regex
// Istio's extraStatTags generates, which the shipped standalone bootstraps
// and the Envoy Gateway EnvoyProxy set too. Extracted, the name is the same
// for every value (kvroute.router.profile.requests, tag kvroute_profile),
// so dashboards sum and split it like any Envoy stat.
//
// The package holds strings only: it is compiled into the Wasm module and
// read by the manifest checks and the dashboard test.
package statnames

import "strings"

// Prefixes: every stat is "kvroute.<filter>." and a name.
const (
	Router    = "kvroute.router."
	PD        = "kvroute.pd."
	Admission = Router + "admission."
	// Namespace is what Envoy puts before every stat a Wasm module defines.
	Namespace = "wasmcustom."
)

// The tags.
const (
	// TagProfile is the scoring profile that decided a request.
	TagProfile = "kvroute_profile"
	// TagBand is the admission priority band (batch, standard, interactive).
	TagBand = "kvroute_band"
	// TagReason is why a request was rejected or fell back.
	TagReason = "kvroute_reason"
	// TagModel is the served model a request was routed for: a model the
	// candidates name, or "other" (see OtherModel).
	TagModel = "kvroute_model"
	// OtherModel is TagModel's value for a model no candidate names (hosts
	// that name no model serve any), so that clients cannot make one
	// series per name they send.
	OtherModel = "other"
)

// Tags lists every tag a kvroute stat can carry: the list to give Istio's
// extraStatTags.
var Tags = []string{TagProfile, TagBand, TagReason, TagModel}

// Tagged is the name of stat name under prefix carrying tag = value: once
// the tag is extracted, prefix+name.
func Tagged(prefix, tag, value, name string) string {
	return prefix + tag + "=.=" + TagValue(value) + ";.;" + name
}

// TagValue keeps a value to the characters a tag value may hold in a name:
// letters, digits, '_' and '-' (anything else becomes '_'), so that a
// configured profile name cannot end the tag early.
func TagValue(v string) string {
	ok := func(r rune) bool {
		return r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
	}
	if strings.IndexFunc(v, func(r rune) bool { return !ok(r) }) < 0 && v != "" {
		return v
	}
	if v == "" {
		return "_"
	}
	return strings.Map(func(r rune) rune {
		if ok(r) {
			return r
		}
		return '_'
	}, v)
}

// TagRegex is the stats_tags regex that extracts tag: its first group is
// removed from the name, its second is the value. It is the regex Istio
// generates for each of extraStatTags.
func TagRegex(tag string) string { return "(" + tag + `=\.=(.*?);\.;)` }
