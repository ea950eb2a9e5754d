package scorer

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/config"
)

// Load parses a plugin configuration (config.Parse) and builds its
// strategy's handler (Build): what the filter does at plugin start and
// what tools do to check a configuration. The error is config.Errors.
func Load(data []byte) (*config.Config, *Handler, []string, error) {
	cfg, err := config.Parse(data)
	if err != nil {
		return nil, nil, nil, err
	}
	h, warnings, err := Build(cfg)
	if err != nil {
		return nil, nil, warnings, err
	}
	return cfg, h, warnings, nil
}

// MaxWeight bounds scorer weights; beyond it one scorer silences the others
// and the configuration is more likely a typo.
const MaxWeight = 1000

// Build resolves the decision layer's keys of a parsed configuration
// (strategy, plugins, profiles, disaggregation) and assembles the
// strategy's handler. Warnings are advisory (the handler works); the
// error, config.Errors, lists every mistake found, each with its path.
func Build(cfg *config.Config) (h *Handler, warnings []string, err error) {
	errs := &config.Errors{}
	b := newBuilder(cfg, errs)
	strategy := cfg.Strategy
	if strategy == "" {
		strategy = config.DefaultStrategy
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
	if err := errs.Err(); err != nil {
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
	new  func(p *config.Params) Plugin
}

var registry = map[string]pluginType{}

// Register adds a plugin type. newFn reads its parameters from p (which
// reports unknown or invalid ones by path) and returns a Filter, Scorer or
// Picker matching kind. Register panics on a duplicate type: call it from
// init.
func Register(typ string, kind Kind, doc string, newFn func(p *config.Params) Plugin) {
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

type builder struct {
	cfg       *config.Config
	errs      *config.Errors
	specs     map[string]*config.PluginSpec
	instances map[string]Plugin
	profiles  map[string]*Profile
	building  map[string]bool
	warnings  []string
}

func newBuilder(cfg *config.Config, errs *config.Errors) *builder {
	b := &builder{cfg: cfg, errs: errs, specs: map[string]*config.PluginSpec{},
		instances: map[string]Plugin{}, profiles: map[string]*Profile{}, building: map[string]bool{}}
	first := map[string]string{}
	for i := range cfg.Plugins {
		s := &cfg.Plugins[i]
		switch {
		case s.Name == "":
			errs.Add(s.Path+".name", "missing: give the instance a name to refer to it from profiles")
			continue
		case first[s.Name] != "":
			errs.Add(s.Path+".name", "duplicate name %q (first defined at %s)", s.Name, first[s.Name])
			continue
		}
		first[s.Name] = s.Path
		if s.Type == "" {
			errs.Add(s.Path+".type", "missing: one of %s", strings.Join(allTypes(), ", "))
			continue
		}
		if _, ok := registry[s.Type]; !ok {
			errs.Add(s.Path+".type", "unknown plugin type %q; known: %s", s.Type, strings.Join(allTypes(), ", "))
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
		typ, params, path = s.Type, s.Params, s.Path+".params"
	} else if _, ok := registry[name]; ok {
		typ, path = name, "plugins."+name+".params"
	} else {
		return nil
	}
	pp := config.NewParams(path, params, b.errs)
	p := registry[typ].new(pp)
	pp.Finish()
	b.instances[name] = p
	return p
}

func (b *builder) resolve(name string, want Kind, path string) Plugin {
	if name == "" {
		b.errs.Add(path, "missing %s name; built-in %ss: %s", want, want, strings.Join(PluginTypes(want), ", "))
		return nil
	}
	p := b.instance(name)
	if p == nil {
		if _, configured := b.specs[name]; !configured && !b.definedButInvalid(name) {
			b.errs.Add(path, "%q is not defined in plugins and is not a built-in %s; built-in %ss: %s",
				name, want, want, strings.Join(PluginTypes(want), ", "))
		}
		return nil
	}
	got := kindOf(p)
	if got != want {
		b.errs.Add(path, "%q is a %s, not a %s", name, got, want)
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

func (b *builder) profile(spec *config.ProfileSpec) *Profile {
	if p, ok := b.profiles[spec.Name]; ok {
		return p
	}
	path := spec.Path
	prof := &Profile{Name: spec.Name, AllowHotspot: spec.AllowHotspot, Index: spec.Index, TrustFeedback: spec.TrustFeedback,
		CorrectIndex: spec.CorrectIndex}
	if len(spec.Filters) == 0 && len(spec.Scorers) == 0 && spec.Picker == "" {
		b.errs.Add(path, "empty profile: list filters, scorers and a picker (or use a preset strategy)")
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
			b.errs.Add(ipath+".weight", "must be >= 0")
		} else if ref.Weight > MaxWeight {
			b.errs.Add(ipath+".weight", "must be <= %d", MaxWeight)
		}
		for j := 0; j < i; j++ {
			if spec.Scorers[j].Plugin == ref.Plugin && ref.Plugin != "" {
				b.errs.Add(ipath+".plugin", "%q is already listed at %s.scorers[%d]: combine the weights", ref.Plugin, path, j)
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
			b.errs.Add(path+".scorers", "every weight is 0, so picker %q would choose blindly: give one scorer a weight > 0", pickerName)
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
			b.errs.Add(path, "affinity scorers (%s) with no distribution or balance scorer is the hotspot recipe: add one, e.g. {\"plugin\": \"pending_tokens\", \"weight\": 1}, or set \"allowHotspot\": true", strings.Join(affinity, ", "))
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
	b.errs.Add(path, "%s", msg)
	return nil
}
