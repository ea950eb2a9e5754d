package scorer

// screen stands for the leading filters of a profile whose verdict on a
// host depends on that host alone — healthy, role, model and saturation,
// each at most once — and tells in one pass over the candidates whether
// every one passes all of them. Each of those filters then returns its
// candidates unchanged and notes nothing, so Profile.run skips them; when
// some host fails one, run calls them one by one as configured, which
// keeps their fail-open rules (nobody healthy, everybody saturated) exact.
//
// A healthy homogeneous fleet, the common case, so enters one loop per
// decision instead of four filter calls: each function entered costs a request
// (docs/performance.md). The profile builder prepares it once (newScreen); a
// Profile assembled by hand has none and runs every filter.
type screen struct {
	filters    int // how many leading filters it stands for (0: none)
	healthy    *healthyFilter
	role       *roleFilter
	model      *modelFilter
	saturation *saturationFilter
}

// newScreen covers the longest run of leading filters of the four
// per-host types in which no type repeats.
func newScreen(filters []Filter) screen {
	var s screen
	for _, f := range filters {
		switch f := f.(type) {
		case *healthyFilter:
			if s.healthy != nil {
				return s
			}
			s.healthy = f
		case *roleFilter:
			if s.role != nil {
				return s
			}
			s.role = f
		case *modelFilter:
			if s.model != nil {
				return s
			}
			s.model = f
		case *saturationFilter:
			if s.saturation != nil {
				return s
			}
			s.saturation = f
		default:
			return s
		}
		s.filters++
	}
	return s
}

// keepsAll reports whether every candidate passes every filter s covers,
// so that running them would change nothing. It answers false for a
// request naming an adapter the model filter must check: that is not a
// test of the host's own fields, and the filter itself decides it.
func (s *screen) keepsAll(c *Cycle, cand []int) bool {
	var model string
	if f := s.model; f != nil {
		if f.requireAdapter && c.Req.Adapter != "" {
			return false
		}
		model = c.Req.Model
	}
	want, anyRole := RoleBoth, true
	if f := s.role; f != nil {
		want, anyRole = f.wants(c)
	}
	for _, i := range cand {
		h := &c.Hosts[i]
		if s.healthy != nil && !s.healthy.ok(h) ||
			!anyRole && !roleKeeps(want, h.Role) ||
			model != "" && !servesModel(h.Model, model) && !(len(h.Adapters) > 0 && listsAdapter(h, model)) ||
			s.saturation != nil && s.saturation.saturated(h) {
			return false
		}
	}
	return true
}
