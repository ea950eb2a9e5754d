package scorer

import (
	"bytes"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// DefaultStrategy is the strategy used when the configuration names none.
const DefaultStrategy = "kv_cache_aware"

// DefaultPrefillThreshold is the estimated uncached prompt tokens from which a
// disaggregated handler sends the prompt to a prefill host (llm-d's decider
// uses the same order of magnitude).
const DefaultPrefillThreshold = 512

// Config is the decision-layer part of the plugin configuration. ParseConfig
// reads only its own top-level keys, so it can be handed the whole plugin
// configuration; the filter owns the others.
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
type Config struct {
	// Strategy names a preset or a profile below; default kv_cache_aware.
	Strategy string
	Plugins  []PluginSpec
	// Profiles in name order.
	Profiles []ProfileSpec
	// Disaggregation, when set, makes the handler pick a prefill host too.
	Disaggregation *DisaggregationSpec
}

// PluginSpec is one named plugin instance.
type PluginSpec struct {
	Name   string
	Type   string
	Params map[string]gjson.Result
	path   string
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
	// TrustFeedback: see Profile.TrustFeedback.
	TrustFeedback bool
	// CorrectIndex: see Profile.CorrectIndex.
	CorrectIndex bool
	path         string
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

// FieldError is one configuration mistake, located by its JSON path. The
// filter's configuration (config) reports with the same type.
type FieldError struct {
	Path string // "profiles.default.scorers[2].weight"; empty for the document itself
	Msg  string // "must be >= 0"
}

func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// ConfigError holds every mistake found in one configuration, in document
// order, so an operator fixes them all in one go.
type ConfigError struct {
	Errors []FieldError
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("invalid routing configuration: ")
	for i, f := range e.Errors {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(f.Error())
	}
	return b.String()
}

type errList struct{ errs []FieldError }

func (l *errList) add(path, format string, args ...any) {
	l.errs = append(l.errs, FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (l *errList) err() error {
	if len(l.errs) == 0 {
		return nil
	}
	return &ConfigError{Errors: l.errs}
}

// object is a JSON object being read field by field, so unknown keys can be
// reported by path. Values are gjson results: the module that embeds this
// package carries no reflection-based JSON decoder.
type object struct {
	path string
	m    map[string]gjson.Result
	used map[string]bool
	errs *errList
}

func joinPath(base, key string) string {
	if base == "" {
		return key
	}
	return base + "." + key
}

func decodeObject(path string, v gjson.Result, errs *errList) (*object, bool) {
	if !v.IsObject() {
		errs.add(pathOrRoot(path), "want a JSON object, got %s", describe(v))
		return nil, false
	}
	m := map[string]gjson.Result{}
	v.ForEach(func(k, val gjson.Result) bool {
		m[k.Str] = val // a repeated key: the last one wins, as in encoding/json
		return true
	})
	return &object{path: path, m: m, used: map[string]bool{}, errs: errs}, true
}

func pathOrRoot(p string) string {
	if p == "" {
		return "(root)"
	}
	return p
}

// describe names a JSON value's kind for error messages without echoing
// long input back.
func describe(v gjson.Result) string {
	switch v.Type {
	case gjson.String:
		return "a string"
	case gjson.True, gjson.False:
		return "a boolean"
	case gjson.Number:
		return "a number"
	case gjson.Null:
		if strings.TrimSpace(v.Raw) == "" {
			return "nothing"
		}
		return "null"
	}
	if v.IsArray() {
		return "an array"
	}
	return "an object"
}

func (o *object) take(key string) (gjson.Result, bool) {
	v, ok := o.m[key]
	if ok {
		o.used[key] = true
	}
	return v, ok
}

// finish reports keys nobody asked for.
func (o *object) finish(known ...string) {
	var unknown []string
	for k := range o.m {
		if !o.used[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		if len(known) > 0 {
			o.errs.add(joinPath(o.path, k), "unknown field; known: %s", strings.Join(known, ", "))
		} else {
			o.errs.add(joinPath(o.path, k), "unknown field; this takes no parameters")
		}
	}
}

func (o *object) str(key string) (string, bool) {
	v, ok := o.take(key)
	if !ok {
		return "", false
	}
	if v.Type != gjson.String {
		o.errs.add(joinPath(o.path, key), "want a string, got %s", describe(v))
		return "", false
	}
	return v.Str, true
}

func (o *object) num(key string) (float64, bool) {
	v, ok := o.take(key)
	if !ok {
		return 0, false
	}
	if v.Type != gjson.Number {
		o.errs.add(joinPath(o.path, key), "want a number, got %s", describe(v))
		return 0, false
	}
	return v.Num, true
}

func (o *object) boolean(key string) (bool, bool) {
	v, ok := o.take(key)
	if !ok {
		return false, false
	}
	if v.Type != gjson.True && v.Type != gjson.False {
		o.errs.add(joinPath(o.path, key), "want true or false, got %s", describe(v))
		return false, false
	}
	return v.Type == gjson.True, true
}

func (o *object) array(key string) ([]gjson.Result, bool) {
	v, ok := o.take(key)
	if !ok {
		return nil, false
	}
	if !v.IsArray() {
		o.errs.add(joinPath(o.path, key), "want an array, got %s", describe(v))
		return nil, false
	}
	return v.Array(), true
}

// ParseConfig reads the decision-layer keys ("strategy", "plugins",
// "profiles", "disaggregation") of a plugin configuration, ignoring the
// others, and checks their shape. Empty input means all defaults. Semantic
// checks (plugin types, parameters, references) happen in Build; both report
// *ConfigError.
func ParseConfig(data []byte) (*Config, error) {
	cfg := &Config{}
	if len(bytes.TrimSpace(data)) == 0 {
		return cfg, nil
	}
	if !gjson.ValidBytes(data) {
		return nil, &ConfigError{Errors: []FieldError{{Path: "(root)", Msg: "not valid JSON: check quotes, commas and brackets"}}}
	}
	return ParseConfigValue(gjson.ParseBytes(data))
}

// ParseConfigValue is ParseConfig for a configuration document the caller
// has already checked to be valid JSON, so one document is scanned once.
func ParseConfigValue(doc gjson.Result) (*Config, error) {
	cfg := &Config{}
	errs := &errList{}
	root, ok := decodeObject("", doc, errs)
	if !ok {
		return nil, errs.err()
	}
	if s, ok := root.str("strategy"); ok {
		cfg.Strategy = s
	}
	if items, ok := root.array("plugins"); ok {
		for i, raw := range items {
			path := fmt.Sprintf("plugins[%d]", i)
			o, ok := decodeObject(path, raw, errs)
			if !ok {
				continue
			}
			spec := PluginSpec{path: path}
			spec.Name, _ = o.str("name")
			spec.Type, _ = o.str("type")
			if praw, ok := o.take("params"); ok {
				if po, ok := decodeObject(path+".params", praw, errs); ok {
					spec.Params = po.m
				}
			}
			o.finish("name", "type", "params")
			cfg.Plugins = append(cfg.Plugins, spec)
		}
	}
	if raw, ok := root.take("profiles"); ok {
		if po, ok := decodeObject("profiles", raw, errs); ok {
			names := make([]string, 0, len(po.m))
			for k := range po.m {
				names = append(names, k)
			}
			sort.Strings(names)
			for _, name := range names {
				po.used[name] = true
				if p, ok := parseProfile(name, "profiles."+name, po.m[name], errs); ok {
					cfg.Profiles = append(cfg.Profiles, p)
				}
			}
		}
	}
	if raw, ok := root.take("disaggregation"); ok {
		if do, ok := decodeObject("disaggregation", raw, errs); ok {
			d := &DisaggregationSpec{Threshold: DefaultPrefillThreshold}
			d.PrefillStrategy, _ = do.str("prefillStrategy")
			if t, ok := do.num("threshold"); ok {
				if t < 0 || t > 1e9 || t != math.Trunc(t) {
					errs.add("disaggregation.threshold", "must be a whole number of tokens >= 0")
				} else {
					d.Threshold = int(t)
				}
			}
			do.finish("prefillStrategy", "threshold")
			cfg.Disaggregation = d
		}
	}
	return cfg, errs.err()
}

func parseProfile(name, path string, raw gjson.Result, errs *errList) (ProfileSpec, bool) {
	o, ok := decodeObject(path, raw, errs)
	if !ok {
		return ProfileSpec{}, false
	}
	p := ProfileSpec{Name: name, path: path}
	if items, ok := o.array("filters"); ok {
		for i, it := range items {
			if it.Type != gjson.String {
				errs.add(fmt.Sprintf("%s.filters[%d]", path, i), "want a plugin name (string), got %s", describe(it))
			}
			p.Filters = append(p.Filters, it.Str)
		}
	}
	if items, ok := o.array("scorers"); ok {
		for i, it := range items {
			ipath := fmt.Sprintf("%s.scorers[%d]", path, i)
			ref := ScorerRef{Weight: 1}
			if it.Type == gjson.String {
				ref.Plugin = it.Str
			} else if so, ok := decodeObject(ipath, it, errs); ok {
				ref.Plugin, _ = so.str("plugin")
				if w, ok := so.num("weight"); ok {
					ref.Weight = w
				}
				so.finish("plugin", "weight")
			}
			p.Scorers = append(p.Scorers, ref)
		}
	}
	p.Picker, _ = o.str("picker")
	p.AllowHotspot, _ = o.boolean("allowHotspot")
	p.TrustFeedback, _ = o.boolean("trustFeedback")
	p.CorrectIndex, _ = o.boolean("correctIndex")
	if raw, ok := o.take("index"); ok {
		if io, ok := decodeObject(path+".index", raw, errs); ok {
			hint := &IndexHint{}
			ip := &Params{obj: *io}
			hint.BlockChars = ip.Int("blockChars", 0, 1, 1<<20)
			hint.CapacityBlocksPerHost = ip.Int("capacityBlocksPerHost", 0, 1, 1<<30)
			ip.obj.finish("blockChars", "capacityBlocksPerHost")
			p.Index = hint
		}
	}
	o.finish("allowHotspot", "filters", "index", "picker", "scorers", "trustFeedback")
	return p, true
}

// MaxWeight bounds scorer weights; beyond it one scorer silences the others
// and the configuration is more likely a typo.
const MaxWeight = 1000

// Build validates the configuration and assembles the strategy's handler.
// Warnings are advisory (the handler works); the error, a *ConfigError,
// lists every mistake found.
func (cfg *Config) Build() (h *Handler, warnings []string, err error) {
	errs := &errList{}
	b := newBuilder(cfg, errs)
	strategy := cfg.Strategy
	if strategy == "" {
		strategy = DefaultStrategy
	}
	// Build every configured profile, used or not: a broken profile is
	// reported at start-up, not when someone switches to it.
	for i := range cfg.Profiles {
		b.profile(&cfg.Profiles[i])
	}
	// Unused plugin instances still get their parameters checked.
	for i := range cfg.Plugins {
		b.instance(cfg.Plugins[i].Name)
	}
	decode := b.strategy(strategy, "strategy")
	h = &Handler{Name: strategy, Decode: decode, MaxPicks: 3}
	if d := cfg.Disaggregation; d != nil {
		ps := d.PrefillStrategy
		if ps == "" {
			ps = strategy
		}
		h.Prefill = b.strategy(ps, "disaggregation.prefillStrategy")
		h.PrefillThreshold = d.Threshold
	}
	if err := errs.err(); err != nil {
		return nil, b.warnings, err
	}
	return h, b.warnings, nil
}

// Kind is what a plugin type is.
type Kind uint8

const (
	KindFilter Kind = iota + 1
	KindScorer
	KindPicker
)

func (k Kind) String() string {
	switch k {
	case KindFilter:
		return "filter"
	case KindScorer:
		return "scorer"
	case KindPicker:
		return "picker"
	}
	return "plugin"
}

type pluginType struct {
	kind Kind
	doc  string
	new  func(p *Params) Plugin
}

var registry = map[string]pluginType{}

// Register adds a plugin type. newFn reads its parameters from p (which
// reports unknown or invalid ones by path) and returns a Filter, Scorer or
// Picker matching kind. Register panics on a duplicate type: call it from
// init.
func Register(typ string, kind Kind, doc string, newFn func(p *Params) Plugin) {
	if _, dup := registry[typ]; dup {
		panic("scorer: plugin type registered twice: " + typ)
	}
	registry[typ] = pluginType{kind: kind, doc: doc, new: newFn}
}

// PluginTypes lists registered plugin types of one kind, sorted.
func PluginTypes(kind Kind) []string {
	var out []string
	for name, t := range registry {
		if t.kind == kind {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Params gives a plugin factory its parameters and records every problem
// with the path of the parameter.
type Params struct {
	obj  object
	keys []string
}

func newParams(path string, m map[string]gjson.Result, errs *errList) *Params {
	return &Params{obj: object{path: path, m: m, used: map[string]bool{}, errs: errs}}
}

// Float reads a number parameter in [min, max], def when absent.
func (p *Params) Float(name string, def, min, max float64) float64 {
	p.keys = append(p.keys, name)
	v, ok := p.obj.num(name)
	if !ok {
		return def
	}
	if v < min || v > max || math.IsNaN(v) {
		p.obj.errs.add(joinPath(p.obj.path, name), "must be in [%s, %s]", fmtNum(min), fmtNum(max))
		return def
	}
	return v
}

// Int reads a whole-number parameter in [min, max], def when absent.
func (p *Params) Int(name string, def, min, max int) int {
	p.keys = append(p.keys, name)
	v, ok := p.obj.num(name)
	if !ok {
		return def
	}
	if v != math.Trunc(v) || v < float64(min) || v > float64(max) {
		p.obj.errs.add(joinPath(p.obj.path, name), "must be a whole number in [%d, %d]", min, max)
		return def
	}
	return int(v)
}

// Bool reads a boolean parameter, def when absent.
func (p *Params) Bool(name string, def bool) bool {
	p.keys = append(p.keys, name)
	v, ok := p.obj.boolean(name)
	if !ok {
		return def
	}
	return v
}

// Enum reads a string parameter that must be one of allowed; def when absent.
func (p *Params) Enum(name, def string, allowed ...string) string {
	p.keys = append(p.keys, name)
	v, ok := p.obj.str(name)
	if !ok {
		return def
	}
	for _, a := range allowed {
		if v == a {
			return v
		}
	}
	p.obj.errs.add(joinPath(p.obj.path, name), "%q is not one of %s", v, strings.Join(allowed, ", "))
	return def
}

// String reads a free-form string parameter, def when absent.
func (p *Params) String(name, def string) string {
	p.keys = append(p.keys, name)
	v, ok := p.obj.str(name)
	if !ok {
		return def
	}
	return v
}

// Errorf reports a problem with parameter name (for cross-field checks).
func (p *Params) Errorf(name, format string, args ...any) {
	p.obj.errs.add(joinPath(p.obj.path, name), format, args...)
}

func fmtNum(f float64) string {
	if math.IsInf(f, 1) {
		return "inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

type builder struct {
	cfg       *Config
	errs      *errList
	specs     map[string]*PluginSpec
	instances map[string]Plugin
	profiles  map[string]*Profile
	building  map[string]bool
	warnings  []string
}

func newBuilder(cfg *Config, errs *errList) *builder {
	b := &builder{cfg: cfg, errs: errs, specs: map[string]*PluginSpec{},
		instances: map[string]Plugin{}, profiles: map[string]*Profile{}, building: map[string]bool{}}
	first := map[string]string{}
	for i := range cfg.Plugins {
		s := &cfg.Plugins[i]
		switch {
		case s.Name == "":
			errs.add(s.path+".name", "missing: give the instance a name to refer to it from profiles")
			continue
		case first[s.Name] != "":
			errs.add(s.path+".name", "duplicate name %q (first defined at %s)", s.Name, first[s.Name])
			continue
		}
		first[s.Name] = s.path
		if s.Type == "" {
			errs.add(s.path+".type", "missing: one of %s", strings.Join(allTypes(), ", "))
			continue
		}
		if _, ok := registry[s.Type]; !ok {
			errs.add(s.path+".type", "unknown plugin type %q; known: %s", s.Type, strings.Join(allTypes(), ", "))
			continue
		}
		b.specs[s.Name] = s
	}
	return b
}

func allTypes() []string {
	out := make([]string, 0, len(registry))
	for k := range registry {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// instance resolves a plugin reference: a configured instance name, or a
// built-in type name with default parameters. It returns nil (after
// reporting nothing) when the name is neither; callers report with their
// own path.
func (b *builder) instance(name string) Plugin {
	if p, ok := b.instances[name]; ok {
		return p
	}
	var (
		typ    string
		params map[string]gjson.Result
		path   string
	)
	if s, ok := b.specs[name]; ok {
		typ, params, path = s.Type, s.Params, s.path+".params"
	} else if _, ok := registry[name]; ok {
		typ, path = name, "plugins."+name+".params"
	} else {
		return nil
	}
	pp := newParams(path, params, b.errs)
	p := registry[typ].new(pp)
	sort.Strings(pp.keys)
	pp.obj.finish(pp.keys...)
	b.instances[name] = p
	return p
}

func (b *builder) resolve(name string, want Kind, path string) Plugin {
	if name == "" {
		b.errs.add(path, "missing %s name; built-in %ss: %s", want, want, strings.Join(PluginTypes(want), ", "))
		return nil
	}
	p := b.instance(name)
	if p == nil {
		if _, configured := b.specs[name]; !configured && !b.definedButInvalid(name) {
			b.errs.add(path, "%q is not defined in plugins and is not a built-in %s; built-in %ss: %s",
				name, want, want, strings.Join(PluginTypes(want), ", "))
		}
		return nil
	}
	got := kindOf(p)
	if got != want {
		b.errs.add(path, "%q is a %s, not a %s", name, got, want)
		return nil
	}
	return p
}

// definedButInvalid reports names that appear in plugins but were rejected
// (already reported there).
func (b *builder) definedButInvalid(name string) bool {
	for _, s := range b.cfg.Plugins {
		if s.Name == name {
			return true
		}
	}
	return false
}

func kindOf(p Plugin) Kind {
	switch p.(type) {
	case Filter:
		return KindFilter
	case Scorer:
		return KindScorer
	case Picker:
		return KindPicker
	}
	return 0
}

func (b *builder) profile(spec *ProfileSpec) *Profile {
	if p, ok := b.profiles[spec.Name]; ok {
		return p
	}
	path := spec.path
	prof := &Profile{Name: spec.Name, AllowHotspot: spec.AllowHotspot, Index: spec.Index, TrustFeedback: spec.TrustFeedback,
		CorrectIndex: spec.CorrectIndex}
	if len(spec.Filters) == 0 && len(spec.Scorers) == 0 && spec.Picker == "" {
		b.errs.add(path, "empty profile: list filters, scorers and a picker (or use a preset strategy)")
		b.profiles[spec.Name] = prof
		return prof
	}
	for i, name := range spec.Filters {
		if f, ok := b.resolve(name, KindFilter, fmt.Sprintf("%s.filters[%d]", path, i)).(Filter); ok {
			prof.Filters = append(prof.Filters, f)
			prof.FilterNames = append(prof.FilterNames, name)
		}
	}
	prof.screen = newScreen(prof.Filters)
	var affinity []string
	spreads := false
	var wsum float64
	for i, ref := range spec.Scorers {
		ipath := fmt.Sprintf("%s.scorers[%d]", path, i)
		if ref.Weight < 0 || math.IsNaN(ref.Weight) {
			b.errs.add(ipath+".weight", "must be >= 0")
		} else if ref.Weight > MaxWeight {
			b.errs.add(ipath+".weight", "must be <= %d", MaxWeight)
		}
		for j := 0; j < i; j++ {
			if spec.Scorers[j].Plugin == ref.Plugin && ref.Plugin != "" {
				b.errs.add(ipath+".plugin", "%q is already listed at %s.scorers[%d]: combine the weights", ref.Plugin, path, j)
			}
		}
		s, ok := b.resolve(ref.Plugin, KindScorer, ipath+".plugin").(Scorer)
		if !ok {
			continue
		}
		w := ref.Weight
		if w < 0 || w > MaxWeight || math.IsNaN(w) {
			w = 0
		}
		_, adapterOnly := s.(loraScorer)
		prof.Scorers = append(prof.Scorers, WeightedScorer{Name: ref.Plugin, Scorer: s, Weight: w, adapterOnly: adapterOnly})
		wsum += w
		if w > 0 {
			switch s.Category() {
			case Affinity:
				affinity = append(affinity, ref.Plugin)
			case Distribution, Balance:
				spreads = true
			}
		}
	}
	pickerName := spec.Picker
	if pickerName == "" {
		pickerName = "max_score"
	}
	if pk, ok := b.resolve(pickerName, KindPicker, path+".picker").(Picker); ok {
		prof.Picker, prof.PickerName = pk, pickerName
		if ns, ok := pk.(interface{ NeedsScores() bool }); ok && ns.NeedsScores() && len(spec.Scorers) > 0 && wsum == 0 {
			b.errs.add(path+".scorers", "every weight is 0, so picker %q would choose blindly: give one scorer a weight > 0", pickerName)
		}
		if ns, ok := pk.(interface{ NeedsScores() bool }); ok && ns.NeedsScores() && len(spec.Scorers) == 0 {
			b.warnings = append(b.warnings, fmt.Sprintf("%s: picker %q ranks by score but the profile has no scorers: every pick is a random tie-break", path, pickerName))
		}
	}
	// The hotspot recipe (docs/strategies.md, "Model"): affinity alone sends every request
	// for a warm prefix to one host until it melts.
	if len(affinity) > 0 && !spreads {
		if spec.AllowHotspot {
			b.warnings = append(b.warnings, fmt.Sprintf("%s: affinity scorers (%s) without a distribution or balance scorer can pile a hot prefix onto one host (allowed by allowHotspot)", path, strings.Join(affinity, ", ")))
		} else {
			b.errs.add(path, "affinity scorers (%s) with no distribution or balance scorer is the hotspot recipe: add one, e.g. {\"plugin\": \"pending_tokens\", \"weight\": 1}, or set \"allowHotspot\": true", strings.Join(affinity, ", "))
		}
	}
	b.profiles[spec.Name] = prof
	return prof
}

// strategy resolves a strategy name: a configured profile first (so an
// operator can redefine a preset), then a preset.
func (b *builder) strategy(name, path string) *Profile {
	for i := range b.cfg.Profiles {
		if b.cfg.Profiles[i].Name == name {
			return b.profile(&b.cfg.Profiles[i])
		}
	}
	if p, err := Preset(name); err == nil {
		return p
	}
	var profs []string
	for _, p := range b.cfg.Profiles {
		profs = append(profs, p.Name)
	}
	msg := fmt.Sprintf("unknown strategy %q; presets: %s", name, strings.Join(PresetNames(), ", "))
	if len(profs) > 0 {
		msg += "; profiles: " + strings.Join(profs, ", ")
	}
	b.errs.add(path, "%s", msg)
	return nil
}
