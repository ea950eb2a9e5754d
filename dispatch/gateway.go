package dispatch

import "github.com/kvroute/kvroute/index"

// The Dispatcher is the Envoy filter's one door to the index: besides the
// request's life (Decide, FirstToken, Finish) and the candidates' slots
// (SetHosts, Housekeep), what the filter reads or writes in the index
// around the decision goes through the methods below, so that the glue of
// a decision (the clock pinned for it, the slots' generations, what was
// applied) lives in one package that imports no proxy-wasm SDK.

// NewShared returns a Dispatcher whose index lives in cfg.Shared, the
// gateway's shared data, as each Envoy worker runs one: the prefix
// matches, the load counters and the slot table, beside the session pins
// and the prefix memory. now is the index's clock in Unix milliseconds
// (nil: the wall clock); cfg.Index is ignored.
func NewShared(cfg Config, now func() int64) (*Dispatcher, error) {
	ix, err := index.New(cfg.Shared, index.Config{Now: now})
	if err != nil {
		return nil, err
	}
	cfg.Index = ix
	return New(cfg), nil
}

// Index is the index the dispatcher books in (nil without one), for
// inspection: tests and the simulator's reports. Callers that route go
// through the Dispatcher's methods.
func (r *Dispatcher) Index() *index.Index { return r.ix }

// HashConfig is how prompts are cut into blocks for this index (the
// defaults without one).
func (r *Dispatcher) HashConfig() index.HashConfig {
	if r.ix == nil {
		return index.NewHasher(index.HashConfig{}).Config()
	}
	return r.ix.Config().Hash
}

// NewHasher returns a hasher whose chains this index matches.
func (r *Dispatcher) NewHasher() *index.Hasher { return index.NewHasher(r.HashConfig()) }

// Loads appends to dst[:0] the gateway's load counters by slot (nil
// without an index).
func (r *Dispatcher) Loads(dst []index.Load) []index.Load {
	if r.ix == nil {
		return dst[:0]
	}
	return r.ix.Loads(dst)
}

// Lookup is addr's slot in the index, if it has one.
func (r *Dispatcher) Lookup(addr string) (index.HostRef, bool) {
	if r.ix == nil {
		return index.HostRef{}, false
	}
	return r.ix.Lookup(addr)
}

// Removed applies an engine's eviction to the index: the host ref no
// longer holds chain from block from on (index.Removed).
func (r *Dispatcher) Removed(ref index.HostRef, chain []uint64, from int) error {
	if r.ix == nil {
		return nil
	}
	return r.ix.Removed(ref, chain, from)
}
