package scorer

import (
	"math"

	"github.com/kvroute/kvroute/config"
)

// WeightedScorer is a scorer with its weight in a profile.
type WeightedScorer struct {
	Name   string // instance name, for explanations
	Scorer Scorer
	Weight float64
	// adapterOnly marks a scorer that tells hosts apart only for requests
	// naming a LoRA adapter (lora_affinity): run skips it, weight
	// included, for the others, so a profile with it decides every
	// base-model request exactly as it would without it, at no cost.
	adapterOnly bool
}

// Profile is one filters → weighted scorers → picker pipeline. It is
// immutable after construction and safe for concurrent use; the per-decision
// state lives in a Scratch.
type Profile struct {
	Name    string
	Filters []Filter
	// FilterNames are the instance names of Filters, for explanations.
	FilterNames []string
	Scorers     []WeightedScorer
	Picker      Picker
	PickerName  string
	// AllowHotspot records that the operator accepted affinity scorers
	// without a distribution or balance scorer.
	AllowHotspot bool
	// Index, when set, is how this profile expects prompts to be indexed.
	Index *config.IndexHint
	// TrustFeedback asks the router to discount each host's predicted
	// matches by how much of its past predictions the engine confirmed
	// (cached_tokens): an index that over-believes a host stops pulling
	// traffic there. Peer emulations leave it off; they have no such loop.
	TrustFeedback bool
	// CorrectIndex asks the router to correct the index when an engine
	// confirms fewer cached tokens than predicted (index.Correct): the
	// host's least recently used blocks, up to the shortfall, stop
	// counting. kvroute's default profile sets it; peer emulations leave it
	// off, as their routers have no such loop.
	CorrectIndex bool

	// screen stands for the leading per-host filters (see screen); the
	// builder prepares it.
	screen screen
}

// Decision is the outcome of one profile run. Its slices belong to the
// Scratch that produced it and are valid until that Scratch's next run.
type Decision struct {
	Profile string
	// Order holds host positions: the primary first, then fallbacks in retry
	// order. Empty when no candidate survived the filters: the caller then
	// fails open (for example to Envoy's own load balancer).
	Order []int
	// Total is the weighted score per host position, normalised by the sum
	// of weights (so in [0, 1]); meaningful for candidates that survived.
	Total []float64
	// Candidates and Survivors count hosts before and after the filters.
	Candidates, Survivors int
	// Note is the last reason a plugin gave ("imbalance guard", ...).
	Note string

	prof *Profile
	raw  [][]float64
}

// Primary returns the chosen host position, or -1.
func (d Decision) Primary() int {
	if len(d.Order) == 0 {
		return -1
	}
	return d.Order[0]
}

// Run decides for req among hosts. maxPicks bounds the primary plus fallbacks
// (at least 1). It never panics on inconsistent input: per-candidate request
// slices shorter than hosts read as zero.
func (p *Profile) Run(req *Request, hosts []Host, maxPicks int, s *Scratch) Decision {
	return p.run(req, hosts, maxPicks, RoleBoth, s)
}

func (p *Profile) run(req *Request, hosts []Host, maxPicks int, role Role, s *Scratch) Decision {
	n := len(hosts)
	if !s.seeded || len(s.total) != n || len(s.raw) < len(p.Scorers) {
		s.prepare(n, len(p.Scorers))
	}
	if maxPicks < 1 {
		maxPicks = 1
	}
	c := &s.cycle
	*c = Cycle{Req: req, Hosts: hosts, MaxPicks: maxPicks, Rand: s.rng, Role: role, s: s}

	cand := s.cand
	for i := range cand {
		cand[i] = i
	}
	filters := p.Filters
	if p.screen.filters > 0 && p.screen.keepsAll(c, cand) {
		filters = filters[p.screen.filters:]
	}
	for _, f := range filters {
		if len(cand) == 0 {
			break
		}
		cand = f.Filter(c, cand)
	}

	total := s.total
	clear(total)
	var wsum float64
	for i, ws := range p.Scorers {
		raw := s.raw[i]
		if len(cand) == 0 || ws.adapterOnly && req.Adapter == "" {
			continue
		}
		ws.Scorer.Score(c, cand, raw)
		wsum += ws.Weight
		for _, h := range cand {
			v := raw[h]
			if v != v || v < 0 { // NaN or negative: a plugin bug must not steer traffic
				v = 0
			} else if v > 1 {
				v = 1
			}
			raw[h] = v
			total[h] += ws.Weight * v
		}
	}
	if wsum > 0 && wsum != 1 {
		inv := 1 / wsum
		for _, h := range cand {
			total[h] *= inv
		}
	}

	order := s.order[:0]
	if len(cand) > 0 {
		order = p.Picker.Pick(c, cand, total, order)
		if len(order) > maxPicks {
			order = order[:maxPicks]
		}
	}
	s.order = order
	return Decision{
		Profile:    p.Name,
		Order:      order,
		Total:      total,
		Candidates: n,
		Survivors:  len(cand),
		Note:       c.note,
		prof:       p,
		raw:        s.raw[:len(p.Scorers)],
	}
}

// ScorerScore returns scorer i's raw score (before weighting) for host
// position h in this decision, or NaN when unknown.
func (d *Decision) ScorerScore(i, h int) float64 {
	if i < 0 || i >= len(d.raw) || h < 0 || h >= len(d.raw[i]) {
		return math.NaN()
	}
	return d.raw[i][h]
}

// Handler runs the profiles of one strategy: a single profile, or, for a
// disaggregated fleet, a decode profile and a prefill profile. It is
// immutable and safe for concurrent use.
type Handler struct {
	// Name is the strategy name (a preset or a configured profile).
	Name string
	// Decode is the profile run for every request (the only one when not
	// disaggregated); it picks the host that generates.
	Decode *Profile
	// Prefill, when set, picks a prefill host for requests whose estimated
	// uncached prompt tokens on the chosen decode host reach
	// PrefillThreshold (llm-d's decider does the same: a short uncached tail
	// is cheaper to prefill in place than to transfer).
	Prefill          *Profile
	PrefillThreshold int
	// MaxPicks is the primary plus fallbacks per profile (default 3).
	MaxPicks int
}

// Result is the outcome of a handler run. Its slices belong to the scratch.
type Result struct {
	Decode Decision
	// Prefill is valid when Disaggregated is true.
	Prefill       Decision
	Disaggregated bool
}

// Run decides for one request. The two decisions use separate scratch
// buffers so both stay valid.
//
// A handler without a prefill profile decides what its Decode profile's
// Run with Picks decides; a caller that makes a decision per request may
// call that directly, and so enter one function less.
func (h *Handler) Run(req *Request, hosts []Host, s *Scratch) Result {
	if h.Prefill != nil {
		return h.runDisaggregated(req, hosts, h.Picks(), s)
	}
	return Result{Decode: h.Decode.run(req, hosts, h.Picks(), RoleBoth, s)}
}

// ReadsLatency reports whether a profile of h scores hosts by their
// latency (Host.LatencyEWMAMs). The filter times responses only when
// something reads the result: without a latency scorer or a latency
// breaker, a response reads no clock.
func (h *Handler) ReadsLatency() bool {
	for _, prof := range [...]*Profile{h.Decode, h.Prefill} {
		if prof == nil {
			continue
		}
		for _, ws := range prof.Scorers {
			if _, ok := ws.Scorer.(latencyScorer); ok {
				return true
			}
		}
	}
	return false
}

// ReadsTTFT reports whether h's decode profile scores by predicted time to
// first token, and the decodeWeight its work counts with: the router then
// keeps each decision's work (TTFTWork) to learn the chosen host's model
// from the time its first token took. Otherwise it learns nothing and the
// filter reads no clock for it.
func (h *Handler) ReadsTTFT() (decodeWeight float64, ok bool) {
	for _, ws := range h.Decode.Scorers {
		if t, ok := ws.Scorer.(*ttftScorer); ok {
			return t.decodeWeight, true
		}
	}
	return 0, false
}

// CorrectIndex reports whether a profile of h asks for the index to be
// corrected by the engines' cached_tokens (Profile.CorrectIndex).
func (h *Handler) CorrectIndex() bool {
	return h.Decode.CorrectIndex || h.Prefill != nil && h.Prefill.CorrectIndex
}

// ReadsPrefixMemory reports whether a profile of h scores hosts by the
// router's prefix memory (Request.PrefixAddress): without a prefix_memory
// scorer the router neither looks it up nor stores to it.
func (h *Handler) ReadsPrefixMemory() bool {
	for _, prof := range [...]*Profile{h.Decode, h.Prefill} {
		if prof == nil {
			continue
		}
		for _, ws := range prof.Scorers {
			if a, ok := ws.Scorer.(*addressScorer); ok && a.memory {
				return true
			}
		}
	}
	return false
}

// Picks is the primary plus fallbacks each profile picks: MaxPicks, or 3
// when unset.
func (h *Handler) Picks() int {
	if h.MaxPicks <= 0 {
		return 3
	}
	return h.MaxPicks
}

// runDisaggregated is Run with a prefill profile. It is a function of its own
// so that Run stays small for the common single-profile handler: each function
// entered costs a request (docs/performance.md).
func (h *Handler) runDisaggregated(req *Request, hosts []Host, maxPicks int, s *Scratch) Result {
	var r Result
	r.Decode = h.Decode.run(req, hosts, maxPicks, RoleDecode, s)
	p := r.Decode.Primary()
	if p < 0 || req.Uncached(p) < h.PrefillThreshold {
		return r
	}
	if s.prefill == nil {
		s.prefill = &Scratch{rng: s.rng, seeded: true}
	}
	r.Prefill = h.Prefill.run(req, hosts, maxPicks, RolePrefill, s.prefill)
	r.Disaggregated = r.Prefill.Primary() >= 0
	return r
}
