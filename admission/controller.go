package admission

// Verdict is what happens to a newly arrived request.
type Verdict int

const (
	// Admit: route and send it now.
	Admit Verdict = iota
	// Hold: it waits in the queue until a tick releases or expires it.
	Hold
	// Refuse: the queue is full of requests that rank at least as high;
	// answer 429 at once.
	Refuse
)

func (v Verdict) String() string {
	return [...]string{"admit", "hold", "refuse"}[v]
}

// Stats are a controller's cumulative counts.
type Stats struct {
	Admitted  uint64 // sent at once
	Held      uint64 // entered the queue
	Released  uint64 // left the queue for an engine
	Expired   uint64 // deadline passed while held (429)
	Shed      uint64 // pushed out of a full queue by a higher-ranked arrival (429)
	Overflow  uint64 // refused at arrival because the queue was full (429)
	Cancelled uint64 // the client went away while held
}

// Controller is one worker's admission state: the held queue and its
// counts. It is not safe for concurrent use; a proxy-wasm worker runs one
// callback at a time.
type Controller struct {
	cfg     Config
	q       *Queue
	stats   Stats
	expired []Item
}

// NewController returns a controller for a validated cfg.
func NewController(cfg Config) *Controller {
	return &Controller{cfg: cfg, q: NewQueue(cfg.MaxHeld)}
}

// Config returns the configuration the controller runs with.
func (c *Controller) Config() *Config { return &c.cfg }

// Queue exposes the held queue (for metrics and tests).
func (c *Controller) Queue() *Queue { return c.q }

// Stats returns the cumulative counts.
func (c *Controller) Stats() Stats { return c.stats }

// Arrive decides for a request that arrived at nowMs. saturated is the
// saturation test over its eligible engines. A request is admitted at once
// only when an engine has room and no held request ranks as high as its
// class, so a newcomer never overtakes a held request of its own class.
// When the queue was full and the newcomer displaced a lower-ranked request,
// evicted is true and shed is that request, which the caller must answer
// with 429.
func (c *Controller) Arrive(id uint64, class Class, deadlineMs, nowMs int64, saturated bool) (v Verdict, shed Item, evicted bool) {
	if !saturated {
		if top, ok := c.q.MaxClass(); !ok || top < class {
			c.stats.Admitted++
			return Admit, Item{}, false
		}
	}
	if c.cfg.MaxHeld <= 0 {
		c.stats.Overflow++
		return Refuse, Item{}, false
	}
	shed, evicted, ok := c.q.Push(Item{ID: id, Class: class, DeadlineMs: deadlineMs, HeldAtMs: nowMs})
	if !ok {
		c.stats.Overflow++
		return Refuse, Item{}, false
	}
	if evicted {
		c.stats.Shed++
	}
	c.stats.Held++
	return Hold, shed, evicted
}

// Tick expires held requests whose deadline is at or before nowMs (returned,
// for the caller to answer with 429), then releases held requests best first
// through release for as long as saturated reports false. release must
// dispatch the request before returning, so that the next saturation test
// sees its pending tokens.
func (c *Controller) Tick(nowMs int64, saturated func() bool, release func(Item)) (expired []Item) {
	c.expired = c.q.Expire(nowMs, c.expired[:0])
	c.stats.Expired += uint64(len(c.expired))
	for c.q.Len() > 0 && !saturated() {
		it, _ := c.q.Pop()
		c.stats.Released++
		release(it)
	}
	return c.expired
}

// Cancel drops a held request whose client went away; it reports whether
// the request was held.
func (c *Controller) Cancel(id uint64) bool {
	if _, ok := c.q.Remove(id); ok {
		c.stats.Cancelled++
		return true
	}
	return false
}
