package config

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// DefaultPrefillThreshold is the estimated uncached prompt tokens from which a
// disaggregated handler sends the prompt to a prefill host (llm-d's decider
// uses the same order of magnitude).
const DefaultPrefillThreshold = 512

// The decision layer's keys: "strategy" names a preset or a profile,
// "plugins" are named plugin instances, "profiles" assemble them, and
// "disaggregation" adds a prefill pick. Parse checks their shape;
// scorer.Build resolves them (plugin types, parameters, references) into
// the strategy's handler, reporting with the same Error type and paths.
//
//	{
//	  "strategy": "mine",
//	  "plugins": [{"name": "guard", "type": "token_load_bound", "params": {"relative": 1.3}}],
//	  "profiles": {
//	    "mine": {
//	      "filters": ["healthy", "guard"],
//	      "scorers": [{"plugin": "prefix_cache", "weight": 3}, {"plugin": "pending_tokens", "weight": 1}],
//	      "picker": "max_score"
//	    }
//	  },
//	  "disaggregation": {"prefillStrategy": "kv_cache_aware", "threshold": 512}
//	}

// PluginSpec is one named plugin instance.
type PluginSpec struct {
	Name string
	Type string
	// Params are read by the plugin type's factory through Params.
	Params map[string]gjson.Result
	// Path locates the instance in the document ("plugins[2]").
	Path string
}

// ProfileSpec lists a profile's plugins by instance name (or by built-in
// type name, which means that type with default parameters).
type ProfileSpec struct {
	Name         string
	Filters      []string
	Scorers      []ScorerRef
	Picker       string
	AllowHotspot bool
	Index        *IndexHint
	// TrustFeedback: see scorer.Profile.TrustFeedback.
	TrustFeedback bool
	// CorrectIndex: see scorer.Profile.CorrectIndex.
	CorrectIndex bool
	// Path locates the profile in the document ("profiles.mine").
	Path string
}

// IndexHint tells the index owner (filter or simulator) how the strategy
// expects prompts to be indexed, for emulations of peers whose index
// differs from kvroute's (GIE: 64-character blocks, 31,250 blocks per pod).
// Zero fields mean kvroute's defaults.
type IndexHint struct {
	BlockChars            int
	CapacityBlocksPerHost int
}

// ScorerRef is a scorer reference with its weight (default 1).
type ScorerRef struct {
	Plugin string
	Weight float64
}

// DisaggregationSpec configures prefill/decode splitting.
type DisaggregationSpec struct {
	// PrefillStrategy is the preset or profile that picks the prefill host.
	PrefillStrategy string
	// Threshold is the estimated uncached prompt tokens from which prefill is
	// disaggregated; below it the decode host prefills in place.
	Threshold int
}

func (p *parser) plugins(v gjson.Result, path string) []PluginSpec {
	var out []PluginSpec
	for i, raw := range p.array(v, path) {
		spec := PluginSpec{Path: path + "[" + strconv.Itoa(i) + "]"}
		o, ok := p.members(raw, spec.Path)
		if !ok {
			continue
		}
		spec.Name = o.String("name", "")
		spec.Type = o.String("type", "")
		if pv, ok := o.take("params"); ok {
			if po, ok := p.members(pv, spec.Path+".params"); ok {
				spec.Params = po.m
			}
		}
		o.Finish()
		out = append(out, spec)
	}
	return out
}

// profiles reads the profiles object, in name order.
func (p *parser) profiles(v gjson.Result, path string) []ProfileSpec {
	o, ok := p.members(v, path)
	if !ok {
		return nil
	}
	names := make([]string, 0, len(o.m))
	for name := range o.m {
		names = append(names, name)
	}
	sort.Strings(names)
	out := make([]ProfileSpec, 0, len(names))
	for _, name := range names {
		if prof, ok := p.profile(name, join(path, name), o.m[name]); ok {
			out = append(out, prof)
		}
	}
	return out
}

func (p *parser) profile(name, path string, v gjson.Result) (ProfileSpec, bool) {
	o, ok := p.members(v, path)
	if !ok {
		return ProfileSpec{}, false
	}
	prof := ProfileSpec{Name: name, Path: path}
	if fv, ok := o.take("filters"); ok {
		for i, it := range p.array(fv, path+".filters") {
			s, _ := p.str(it, path+".filters["+strconv.Itoa(i)+"]")
			prof.Filters = append(prof.Filters, s)
		}
	}
	if sv, ok := o.take("scorers"); ok {
		for i, it := range p.array(sv, path+".scorers") {
			ref := ScorerRef{Plugin: it.Str, Weight: 1}
			if it.Type != gjson.String {
				if so, ok := p.members(it, path+".scorers["+strconv.Itoa(i)+"]"); ok {
					ref.Plugin = so.String("plugin", "")
					ref.Weight = so.Float("weight", 1, math.Inf(-1), math.Inf(1)) // Build checks the range
					so.Finish()
				}
			}
			prof.Scorers = append(prof.Scorers, ref)
		}
	}
	prof.Picker = o.String("picker", "")
	prof.AllowHotspot = o.Bool("allowHotspot", false)
	prof.TrustFeedback = o.Bool("trustFeedback", false)
	prof.CorrectIndex = o.Bool("correctIndex", false)
	if iv, ok := o.take("index"); ok {
		if io, ok := p.members(iv, path+".index"); ok {
			prof.Index = &IndexHint{BlockChars: io.Int("blockChars", 0, 1, 1<<20), CapacityBlocksPerHost: io.Int("capacityBlocksPerHost", 0, 1, 1<<30)}
			io.Finish()
		}
	}
	o.Finish()
	return prof, true
}

func (p *parser) disaggregation(v gjson.Result, path string) *DisaggregationSpec {
	o, ok := p.members(v, path)
	if !ok {
		return nil
	}
	d := &DisaggregationSpec{PrefillStrategy: o.String("prefillStrategy", ""), Threshold: o.Int("threshold", DefaultPrefillThreshold, 0, 1e9)}
	o.Finish()
	return d
}

func (p *parser) array(v gjson.Result, path string) []gjson.Result {
	if !v.IsArray() {
		p.fail(path, "must be an array, got %s", kind(v))
		return nil
	}
	return v.Array()
}

// members reads the object v at path key by key, through Params: the
// keys of the decision layer's objects, like a plugin's parameters, are
// read where they are used, and Finish reports the ones nobody read.
func (p *parser) members(v gjson.Result, path string) (*Params, bool) {
	if !v.IsObject() {
		p.fail(path, "must be an object, got %s", kind(v))
		return nil, false
	}
	m := map[string]gjson.Result{}
	v.ForEach(func(k, val gjson.Result) bool {
		if _, dup := m[k.Str]; dup {
			p.fail(join(path, k.Str), "given twice")
		}
		m[k.Str] = val
		return true
	})
	return NewParams(path, m, &p.errs), true
}

// Params gives a plugin type's factory (scorer.Register) the parameters
// of one instance: each read names its parameter, a bad value is an Error
// with the parameter's path, and Finish reports the parameters nobody read.
type Params struct {
	path string
	m    map[string]gjson.Result
	read []string
	errs *Errors
}

// NewParams reads m, the params of the instance at path, reporting to errs.
func NewParams(path string, m map[string]gjson.Result, errs *Errors) *Params {
	return &Params{path: path, m: m, errs: errs}
}

func (p *Params) take(name string) (gjson.Result, bool) {
	p.read = append(p.read, name)
	v, ok := p.m[name]
	return v, ok
}

// value takes parameter name when it is given and of type t (True for a
// boolean), reporting one of another type as not what (a number, ...).
func (p *Params) value(name string, t gjson.Type, what string) (gjson.Result, bool) {
	v, ok := p.take(name)
	if !ok {
		return v, false
	}
	if v.Type != t && !(t == gjson.True && v.Type == gjson.False) {
		p.Errorf(name, "must be %s, got %s", what, kind(v))
		return v, false
	}
	return v, true
}

// Float reads a number parameter in [min, max], def when absent.
func (p *Params) Float(name string, def, min, max float64) float64 {
	v, ok := p.value(name, gjson.Number, "a number")
	if !ok {
		return def
	}
	if v.Num < min || v.Num > max || math.IsNaN(v.Num) {
		p.Errorf(name, "must be in [%s, %s]", fmtNum(min), fmtNum(max))
		return def
	}
	return v.Num
}

// Int reads a whole-number parameter in [min, max], def when absent.
func (p *Params) Int(name string, def, min, max int) int {
	v, ok := p.value(name, gjson.Number, "a number")
	if !ok {
		return def
	}
	if v.Num != math.Trunc(v.Num) || v.Num < float64(min) || v.Num > float64(max) {
		p.Errorf(name, "must be a whole number in [%d, %d]", min, max)
		return def
	}
	return int(v.Num)
}

// Bool reads a boolean parameter, def when absent.
func (p *Params) Bool(name string, def bool) bool {
	v, ok := p.value(name, gjson.True, "true or false")
	if !ok {
		return def
	}
	return v.Type == gjson.True
}

// String reads a free-form string parameter, def when absent.
func (p *Params) String(name, def string) string {
	v, ok := p.value(name, gjson.String, "a string")
	if !ok {
		return def
	}
	return v.Str
}

// Enum reads a string parameter that must be one of allowed; def when absent.
func (p *Params) Enum(name, def string, allowed ...string) string {
	v, ok := p.value(name, gjson.String, "a string")
	if !ok {
		return def
	}
	for _, a := range allowed {
		if v.Str == a {
			return v.Str
		}
	}
	p.Errorf(name, "%q is not one of %s", v.Str, strings.Join(allowed, ", "))
	return def
}

// Errorf reports a problem with parameter name (for cross-field checks).
func (p *Params) Errorf(name, format string, args ...any) {
	p.errs.Add(join(p.path, name), format, args...)
}

// Finish reports every parameter given that the factory did not read.
func (p *Params) Finish() {
	known := append([]string(nil), p.read...)
	sort.Strings(known)
	known = slices.Compact(known)
	var unknown []string
	for k := range p.m {
		if !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		if len(known) > 0 {
			p.errs.Add(join(p.path, k), "unknown key (known keys: %s)", strings.Join(known, ", "))
		} else {
			p.errs.Add(join(p.path, k), "unknown key (this plugin takes no parameters)")
		}
	}
}

func fmtNum(f float64) string {
	if math.IsInf(f, 1) {
		return "inf"
	}
	if math.IsInf(f, -1) {
		return "-inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// Add records one problem at path.
func (es *Errors) Add(path, format string, args ...any) {
	*es = append(*es, &Error{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// Err is es as an error, nil when it holds none.
func (es Errors) Err() error {
	if len(es) == 0 {
		return nil
	}
	return es
}
