package scorer

import (
	"math"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/config"
)

func init() {
	Register("max_score", KindPicker,
		"the highest total score, ties broken at random; fallbacks by descending score",
		func(p *config.Params) Plugin {
			if p.Enum("tieBreak", "random", "random", "round_robin") == "round_robin" {
				return &maxScoreRoundRobinPicker{}
			}
			return &maxScorePicker{}
		})
	Register("weighted_random", KindPicker,
		"samples the primary with probability softmax(score / temperature); fallbacks by descending score",
		func(p *config.Params) Plugin {
			return weightedRandomPicker{temperature: p.Float("temperature", 0.1, 1e-6, 1e6)}
		})
	Register("power_of_two", KindPicker,
		"samples two candidates at random and keeps the better scored (power of two choices)",
		func(p *config.Params) Plugin { return powerOfTwoPicker{} })
	Register("round_robin", KindPicker,
		"each candidate in turn, ignoring scores",
		func(p *config.Params) Plugin { return &roundRobinPicker{} })
	Register("random", KindPicker,
		"a uniformly random candidate, ignoring scores",
		func(p *config.Params) Plugin { return randomPicker{} })
	Register("consistent_hash", KindPicker,
		"rendezvous (consistent) hashing of the prompt-prefix hash with bounded-load spill-over: a host above loadFactor times the mean in-flight load is skipped for the next one in the key's order",
		func(p *config.Params) Plugin {
			return consistentHashPicker{loadFactor: p.Float("loadFactor", 1.25, 1, 100)}
		})
}

// NeedsScores marks pickers that rank by the profile's scores.
func (*maxScorePicker) NeedsScores() bool           { return true }
func (*maxScoreRoundRobinPicker) NeedsScores() bool { return true }
func (weightedRandomPicker) NeedsScores() bool      { return true }
func (powerOfTwoPicker) NeedsScores() bool          { return true }

const scoreEpsilon = 1e-9

func contains(order []int, h int) bool {
	for _, o := range order {
		if o == h {
			return true
		}
	}
	return false
}

// appendByScore appends the best-scored candidates not yet in order until
// order holds max entries (or every candidate with a score above -Inf is
// in): by descending score, ties in candidate order, exactly what picking
// the first best remaining candidate max-len(order) times gives. One pass
// that keeps the few best in a small array: max is small (the primary and
// two or three fallbacks) and this allocates nothing.
func appendByScore(order, cand []int, scores []float64, max int) []int {
	need := min(max, len(cand)) - len(order)
	if need <= 0 {
		return order
	}
	if need > maxTop {
		return appendByScoreSlow(order, cand, scores, max)
	}
	var top [maxTop]int
	var topS [maxTop]float64
	k := 0
	for _, h := range cand {
		v := scores[h]
		if !(v > math.Inf(-1)) || k == need && !(v > topS[k-1]) {
			continue // never picked (NaN, -Inf), or not better than the last kept
		}
		if contains(order, h) {
			continue
		}
		j := k
		if k < need {
			k++
		} else {
			j = need - 1 // the last kept one drops out
		}
		for j > 0 && topS[j-1] < v { // after every kept one scoring as much
			top[j], topS[j] = top[j-1], topS[j-1]
			j--
		}
		top[j], topS[j] = h, v
	}
	return append(order, top[:k]...)
}

// maxTop bounds the picks appendByScore selects in one pass.
const maxTop = 8

// appendByScoreSlow is appendByScore by repeated selection, for long orders.
func appendByScoreSlow(order, cand []int, scores []float64, max int) []int {
	for len(order) < max && len(order) < len(cand) {
		best, bestScore := -1, math.Inf(-1)
		for _, h := range cand {
			if scores[h] > bestScore && !contains(order, h) {
				best, bestScore = h, scores[h]
			}
		}
		if best < 0 {
			break
		}
		order = append(order, best)
	}
	return order
}

// appendByLeast is appendByScore for costs (lower is better).
func appendByLeast(order, cand []int, cost []float64, max int) []int {
	for len(order) < max && len(order) < len(cand) {
		best, bestCost := -1, math.Inf(1)
		for _, h := range cand {
			if cost[h] < bestCost && !contains(order, h) {
				best, bestCost = h, cost[h]
			}
		}
		if best < 0 {
			break
		}
		order = append(order, best)
	}
	return order
}

// argmaxRandomTie returns the candidate with the highest value, choosing
// uniformly among ties (reservoir sampling, no allocation).
func argmaxRandomTie(c *Cycle, cand []int, v []float64) int {
	m := newTieMax()
	for _, h := range cand {
		if m.add(h, v[h]) {
			m.tie(c, h)
		}
	}
	return m.pick
}

// tieMax is a running argmax that breaks ties uniformly at random by
// reservoir sampling: one random draw per tied candidate after the first.
type tieMax struct {
	pick, ties int
	best       float64
}

func newTieMax() tieMax { return tieMax{pick: -1, best: math.Inf(-1)} }

// add takes candidate h with score s and reports whether s ties with the
// best so far, which the caller then settles with tie. The draw is the
// caller's call so that add, making none, inlines into the pickers' loops:
// in Wasm a call per candidate costs more than the comparisons.
func (m *tieMax) add(h int, s float64) (tied bool) {
	if s > m.best+scoreEpsilon {
		m.pick, m.best, m.ties = h, s, 1
		return false
	}
	return s >= m.best-scoreEpsilon
}

// tie counts h as one more candidate tied with the best and keeps it with
// probability 1/ties. maxScorePicker.Pick, which every max_score decision
// enters, has its body written out; the two must draw alike
// (TestMaxScorePickMatchesTwoPasses checks it with the same seed).
func (m *tieMax) tie(c *Cycle, h int) {
	m.ties++
	if c.Rand.IntN(m.ties) == 0 {
		m.pick = h
	}
}

// maxScorePicker takes the best total score, ties broken at random. tieBreak
// round_robin builds a maxScoreRoundRobinPicker instead: two types rather than
// one with a flag, so that the Pick every routed request enters is the picking
// itself, not a dispatch in front of it (each function entered costs a
// request: docs/performance.md).
type maxScorePicker struct{}

func (*maxScorePicker) Type() string { return "max_score" }

// Pick is argmaxRandomTie followed by appendByScore in one pass: it draws
// the same random numbers for the same ties, and keeps the best
// min(MaxPicks, len(cand)) candidates by score (ties in candidate order) on
// the way. The fallbacks are those without the primary: what appendByScore
// would choose among the others.
func (*maxScorePicker) Pick(c *Cycle, cand []int, v []float64, order []int) []int {
	need := min(c.MaxPicks, len(cand))
	if need > maxTop || len(order) > 0 {
		return pickBestRandomTieSlow(c, cand, v, order)
	}
	var top [maxTop]int
	var topS [maxTop]float64
	k := 0
	m := newTieMax()
	for _, h := range cand {
		s := v[h]
		if m.add(h, s) {
			// tie's body, written out: routed requests tie (a
			// fresh fleet scores alike), and a call here is one
			// more function entered per request in Wasm.
			m.ties++
			if c.Rand.IntN(m.ties) == 0 {
				m.pick = h
			}
		}
		if !(s > math.Inf(-1)) || k == need && !(s > topS[k-1]) {
			continue
		}
		j := k
		if k < need {
			k++
		} else {
			j = need - 1
		}
		for j > 0 && topS[j-1] < s {
			top[j], topS[j] = top[j-1], topS[j-1]
			j--
		}
		top[j], topS[j] = h, s
	}
	order = append(order, m.pick)
	for i := 0; i < k && len(order) < need; i++ {
		if top[i] != m.pick {
			order = append(order, top[i])
		}
	}
	return order
}

// maxScoreRoundRobinPicker takes the best total score, ties dealt out in
// turn, which is what sticky_session needs: with no session pin every host
// ties and new sessions are dealt out evenly.
type maxScoreRoundRobinPicker struct{ next atomic.Uint64 }

func (*maxScoreRoundRobinPicker) Type() string { return "max_score" }
func (p *maxScoreRoundRobinPicker) Pick(c *Cycle, cand []int, scores []float64, order []int) []int {
	best := math.Inf(-1)
	for _, h := range cand {
		best = max(best, scores[h])
	}
	ties := 0
	for _, h := range cand {
		if scores[h] >= best-scoreEpsilon {
			ties++
		}
	}
	k := int(p.next.Add(1)-1) % ties
	var primary int
	for _, h := range cand {
		if scores[h] >= best-scoreEpsilon {
			if k == 0 {
				primary = h
				break
			}
			k--
		}
	}
	order = append(order, primary)
	return appendByScore(order, cand, scores, c.MaxPicks)
}

// pickBestRandomTieSlow is maxScorePicker.Pick in two passes, for more picks
// than its fixed arrays hold or an order that already has entries. It is a
// function of its own so that the common case does not carry its calls: each
// function entered costs a request (docs/performance.md).
func pickBestRandomTieSlow(c *Cycle, cand []int, v []float64, order []int) []int {
	order = append(order, argmaxRandomTie(c, cand, v))
	return appendByScore(order, cand, v, c.MaxPicks)
}

type weightedRandomPicker struct{ temperature float64 }

func (weightedRandomPicker) Type() string { return "weighted_random" }
func (p weightedRandomPicker) Pick(c *Cycle, cand []int, scores []float64, order []int) []int {
	order = append(order, softmaxSample(c, cand, scores, p.temperature))
	return appendByScore(order, cand, scores, c.MaxPicks)
}

// softmaxSample draws a candidate with probability proportional to
// exp(v/temperature).
func softmaxSample(c *Cycle, cand []int, v []float64, temperature float64) int {
	hi := math.Inf(-1)
	for _, h := range cand {
		hi = max(hi, v[h])
	}
	w := c.Floats()
	var sum float64
	for _, h := range cand {
		w[h] = math.Exp((v[h] - hi) / temperature)
		sum += w[h]
	}
	r := c.Rand.Float64() * sum
	for _, h := range cand {
		r -= w[h]
		if r < 0 {
			return h
		}
	}
	return cand[len(cand)-1]
}

type powerOfTwoPicker struct{}

func (powerOfTwoPicker) Type() string { return "power_of_two" }
func (powerOfTwoPicker) Pick(c *Cycle, cand []int, scores []float64, order []int) []int {
	if len(cand) == 1 {
		return append(order, cand[0])
	}
	i := c.Rand.IntN(len(cand))
	j := c.Rand.IntN(len(cand) - 1)
	if j >= i {
		j++
	}
	a, b := cand[i], cand[j]
	if scores[b] > scores[a] || scores[b] == scores[a] && c.Rand.IntN(2) == 0 {
		a, b = b, a
	}
	order = append(order, a)
	if c.MaxPicks > 1 {
		order = append(order, b)
	}
	return appendByScore(order, cand, scores, c.MaxPicks)
}

type roundRobinPicker struct{ next atomic.Uint64 }

func (*roundRobinPicker) Type() string { return "round_robin" }
func (p *roundRobinPicker) Pick(c *Cycle, cand []int, _ []float64, order []int) []int {
	n := len(cand)
	start := int(p.next.Add(1)-1) % n
	for k := 0; k < n && k < c.MaxPicks; k++ {
		order = append(order, cand[(start+k)%n])
	}
	return order
}

type randomPicker struct{}

func (randomPicker) Type() string { return "random" }
func (randomPicker) Pick(c *Cycle, cand []int, _ []float64, order []int) []int {
	n := len(cand)
	start := c.Rand.IntN(n)
	for k := 0; k < n && k < c.MaxPicks; k++ {
		order = append(order, cand[(start+k)%n])
	}
	return order
}

// consistentHashPicker implements the prefix_hash strategy: consistent
// hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, "Consistent
// Hashing with Bounded Loads", 2018), on rendezvous hashing rather than a
// ring. Rendezvous hashing needs no ring to rebuild when the candidate set
// changes (every decision may see a different filtered set) and each key's
// spill order is its own pseudo-random permutation, so a hot prefix's
// overflow spreads instead of landing on one ring successor.
type consistentHashPicker struct{ loadFactor float64 }

func (consistentHashPicker) Type() string { return "consistent_hash" }

// hostID returns the host's stable hash.
func hostID(h *Host) uint64 {
	if h.ID != 0 {
		return h.ID
	}
	return xxhash.Sum64String(h.Address)
}

// mix64 is a 64-bit finalizer (SplitMix64's): it turns key^id into a
// uniformly distributed rendezvous weight.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func (p consistentHashPicker) Pick(c *Cycle, cand []int, _ []float64, order []int) []int {
	key := c.Req.PrefixHash
	if key == 0 {
		c.Note("no prefix: random")
		return randomPicker{}.Pick(c, cand, nil, order)
	}
	total := 0
	for _, h := range cand {
		total += c.Hosts[h].InFlight
	}
	// A host may take this request if it stays within loadFactor times the
	// mean load counting this request: ceil(c * (total+1) / n).
	bound := int(math.Ceil(p.loadFactor * float64(total+1) / float64(len(cand))))
	w := c.Floats()
	for _, h := range cand {
		v := float64(mix64(key^hostID(&c.Hosts[h])) >> 11) // 53 bits, exact in float64
		if c.Hosts[h].InFlight+1 > bound {
			v -= 1 << 53 // over the bound: after every host within it, same order
		}
		w[h] = v
	}
	order = appendByScore(order, cand, w, c.MaxPicks)
	if len(order) > 0 && c.Hosts[order[0]].InFlight+1 > bound {
		c.Note("every host over the load bound")
	} else if len(order) > 0 {
		// Was the key's first choice skipped?
		top, topW := -1, uint64(0)
		for _, h := range cand {
			if x := mix64(key ^ hostID(&c.Hosts[h])); top < 0 || x > topW {
				top, topW = h, x
			}
		}
		if top != order[0] {
			c.Note("spill: first choice over the load bound")
		}
	}
	return order
}
