package server

import (
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
)

// progress is what a request's handler learns from the engine: how many
// output tokens exist so far and whether the request is done.
type progress struct {
	generated int
	done      bool
}

// liveEngine runs a sim.Engine in (scaled) real time: a driver goroutine
// plans a step, sleeps its duration times the time scale, then tells each
// request's handler what the step produced. Requests arriving meanwhile join
// the waiting queue and are batched into the next step, as in vLLM.
type liveEngine struct {
	mu    sync.Mutex
	eng   *sim.Engine
	subs  map[*sim.Request]chan progress
	scale float64
	vnow  time.Duration
	start time.Time
	wake  chan struct{}
	quit  chan struct{}
	done  chan struct{}
	// pub publishes each step's KV events (nil: not published).
	pub *kvPublisher
}

func newLiveEngine(p sim.Profile, scale float64, pub *kvPublisher) *liveEngine {
	le := &liveEngine{
		pub:   pub,
		eng:   sim.NewEngine(p),
		subs:  map[*sim.Request]chan progress{},
		scale: scale,
		start: time.Now(),
		wake:  make(chan struct{}, 1),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	if pub != nil {
		le.eng.EnableKVEvents()
	}
	go le.drive()
	return le
}

// submit queues r; the returned channel carries its latest progress (a
// coalescing mailbox: a slow reader sees the newest count, never a backlog).
func (le *liveEngine) submit(r *sim.Request) (<-chan progress, error) {
	le.mu.Lock()
	r.Arrival = le.vnow
	if err := le.eng.Add(r); err != nil {
		le.mu.Unlock()
		return nil, err
	}
	ch := make(chan progress, 1)
	le.subs[r] = ch
	le.mu.Unlock()
	select {
	case le.wake <- struct{}{}:
	default:
	}
	return ch, nil
}

// abort drops a request whose client went away.
func (le *liveEngine) abort(r *sim.Request) {
	le.mu.Lock()
	defer le.mu.Unlock()
	if _, ok := le.subs[r]; ok {
		le.eng.Abort(r)
		delete(le.subs, r)
	}
}

func (le *liveEngine) stats() sim.Stats {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.eng.Stats()
}

func (le *liveEngine) close() {
	close(le.quit)
	<-le.done
	if le.pub != nil {
		le.pub.close()
	}
}

type delivery struct {
	ch chan progress
	p  progress
}

func (le *liveEngine) drive() {
	defer close(le.done)
	var out []delivery
	for {
		le.mu.Lock()
		if le.eng.Idle() {
			le.mu.Unlock()
			select {
			case <-le.wake:
			case <-le.quit:
				return
			}
			le.mu.Lock()
			if le.scale > 0 {
				le.vnow = max(le.vnow, time.Duration(float64(time.Since(le.start))/le.scale))
			}
			le.mu.Unlock()
			continue
		}
		st := le.eng.Step(le.vnow)
		dur := st.Duration
		var evs []sim.KVEvent
		if le.pub != nil {
			evs = le.eng.TakeKVEvents()
		}
		out = out[:0]
		for _, r := range st.Tokens {
			if ch, ok := le.subs[r]; ok {
				done := r.Generated >= r.MaxTokens
				out = append(out, delivery{ch, progress{generated: r.Generated, done: done}})
				if done {
					delete(le.subs, r)
				}
			}
		}
		le.mu.Unlock()
		if len(evs) > 0 {
			// Published as the step is scheduled, as vLLM's scheduler
			// publishes a step's cache changes when it plans the step.
			le.pub.publish(evs, le.vnow)
		}

		// Sleep until the step's end on the virtual clock mapped to wall
		// time, not for its duration: a late wake-up (a loaded machine)
		// is made up by the next steps instead of accumulating.
		if wait := time.Until(le.start.Add(time.Duration(float64(le.vnow+dur) * le.scale))); wait > 0 && le.scale > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-le.quit:
				t.Stop()
				return
			}
		}
		le.mu.Lock()
		le.vnow += dur
		le.mu.Unlock()
		for _, d := range out {
			select { // keep only the newest progress
			case <-d.ch:
			default:
			}
			d.ch <- d.p
		}
	}
}
