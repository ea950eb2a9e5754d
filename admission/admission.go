// Package admission decides whether an inference request goes to an engine
// now, waits in the proxy, or is refused, so that a flood of long batch jobs
// cannot starve interactive chat.
//
// # Model
//
// Every request has a Class (higher is more urgent) and a deadline. While at
// least one eligible engine is below every saturation threshold (waiting
// queue, KV use, pending prefill tokens), requests go straight to the router,
// unless a held request of the same or a higher class is waiting, which keeps
// order within a class. Once every eligible engine is saturated, requests are
// held in a bounded Queue. On each tick the controller expires held requests
// whose deadline passed, then releases the best held request (highest class,
// earliest deadline, then arrival order) for as long as an engine is below
// its thresholds, re-testing saturation after each release, because each
// dispatch raises the pending-token counters at once while pushed engine
// state lags by a scrape interval.
//
// When the queue is full, a newcomer that ranks above the worst held request
// takes its place and the worst is shed; otherwise the newcomer is refused at
// once. Lower classes are therefore shed first.
//
// The package imports neither the proxy-wasm SDK nor the simulator: the Envoy
// filter (filter/admission.go) and the fleet simulator
// (internal/sim/fleet/admission.go) drive the same Controller, so the strategy
// measured in simulation is the one that ships.
package admission

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Class is a priority class: higher classes are released first and shed
// last. Integers in [MinClass, MaxClass] are accepted; the named classes sit
// at 1, 5 and 9 so that operators can slot their own levels in between.
type Class int

// Named classes.
const (
	Batch       Class = 1
	Standard    Class = 5
	Interactive Class = 9

	MinClass Class = 0
	MaxClass Class = 9
)

// Bands are the metric names of the three class bands, lowest first.
var Bands = [3]string{"batch", "standard", "interactive"}

// Band is the index in Bands of the band c falls into: a class counts as
// interactive from Interactive up, standard from Standard up, else batch.
func (c Class) Band() int {
	switch {
	case c >= Interactive:
		return 2
	case c >= Standard:
		return 1
	default:
		return 0
	}
}

func (c Class) String() string {
	switch c {
	case Batch:
		return "batch"
	case Standard:
		return "standard"
	case Interactive:
		return "interactive"
	}
	return strconv.Itoa(int(c))
}

// ParseClass reads a class name (interactive, standard, batch; any case) or
// an integer in [MinClass, MaxClass].
func ParseClass(s string) (Class, error) {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "interactive":
		return Interactive, nil
	case "standard":
		return Standard, nil
	case "batch":
		return Batch, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < int(MinClass) || n > int(MaxClass) {
		return 0, fmt.Errorf("priority %q: use interactive, standard, batch or an integer from %d to %d", s, MinClass, MaxClass)
	}
	return Class(n), nil
}

// Defaults.
const (
	DefaultTickMs       = 10
	DefaultMaxHeld      = 256
	DefaultRetryAfterS  = 1
	DefaultMaxWaiting   = 4
	DefaultMaxKVUsage   = 0.95
	DefaultMaxPending   = 8192
	MaxDeadlineMs       = 3_600_000
	DefaultInteractiveD = 10_000
	DefaultStandardD    = 30_000
	// DefaultBatchD stays under Envoy's default stream_idle_timeout (5
	// min), which would otherwise answer a held request 408 first.
	DefaultBatchD = 240_000
)

// Thresholds say when one engine is saturated: any one reached is enough.
// Zero disables a threshold.
type Thresholds struct {
	// MaxWaiting is the engine's waiting queue (pushed state).
	MaxWaiting int
	// MaxKVUsage is the engine's KV use, 0 to 1 (pushed state).
	MaxKVUsage float64
	// MaxPendingPrefillTokens is the prompt tokens dispatched to the engine
	// whose first token has not come back yet: the gateway's own
	// accounting, shared by every worker, current to the last dispatch.
	MaxPendingPrefillTokens int64
}

// Load is what the saturation test reads for one eligible engine.
type Load struct {
	Waiting              int
	KVUsage              float64
	PendingPrefillTokens int64
}

// Saturated reports whether l reaches any threshold.
func (t *Thresholds) Saturated(l Load) bool {
	return (t.MaxWaiting > 0 && l.Waiting >= t.MaxWaiting) ||
		(t.MaxKVUsage > 0 && l.KVUsage >= t.MaxKVUsage) ||
		(t.MaxPendingPrefillTokens > 0 && l.PendingPrefillTokens >= t.MaxPendingPrefillTokens)
}

// AllSaturated reports whether every engine in loads is saturated. With no
// eligible engine it reports false: holding cannot help, and the router's
// own no-candidate path answers.
func (t *Thresholds) AllSaturated(loads []Load) bool {
	if len(loads) == 0 {
		return false
	}
	for _, l := range loads {
		if !t.Saturated(l) {
			return false
		}
	}
	return true
}

// Config is the admission configuration (the filter's "admission" key).
type Config struct {
	Enabled bool
	// TickMs is how often held requests are examined.
	TickMs int
	// MaxHeld bounds the held queue of one worker.
	MaxHeld int
	// RetryAfterS is the Retry-After of a 429.
	RetryAfterS int
	// DefaultClass applies when neither the header, the path nor the model
	// says otherwise.
	DefaultClass Class
	// PathClasses and ModelClasses are defaults by request path and by
	// model name; the model wins over the path, the header over both.
	PathClasses  map[string]Class
	ModelClasses map[string]Class
	// DeadlineMs is the default deadline per class band (Bands order),
	// counted from arrival at the gateway.
	DeadlineMs [3]int
	Thresholds Thresholds
	// PriorityHeader and DeadlineHeader name the request headers a class
	// and a deadline are read from ("" reads none, the default). They are
	// the operator's, not the client's: Envoy must set or remove them before
	// kvroute runs (a header_mutation filter, per route or after an
	// authenticating filter), or any client could claim the top class.
	PriorityHeader, DeadlineHeader string
}

// Defaults returns the configuration with every default applied and
// admission disabled.
func Defaults() Config {
	return Config{
		TickMs: DefaultTickMs, MaxHeld: DefaultMaxHeld, RetryAfterS: DefaultRetryAfterS,
		DefaultClass: Standard,
		DeadlineMs:   [3]int{DefaultBatchD, DefaultStandardD, DefaultInteractiveD},
		Thresholds:   Thresholds{MaxWaiting: DefaultMaxWaiting, MaxKVUsage: DefaultMaxKVUsage, MaxPendingPrefillTokens: DefaultMaxPending},
	}
}

// Validate reports the first field that makes c unusable.
func (c *Config) Validate() error {
	switch {
	case c.TickMs < 1 || c.TickMs > 1000:
		return errors.New("tickMs: use 1 to 1000")
	case c.MaxHeld < 0:
		return errors.New("maxHeld: must not be negative (0 refuses instead of holding)")
	case c.RetryAfterS < 0:
		return errors.New("retryAfterS: must not be negative")
	case c.Thresholds.MaxWaiting <= 0 && c.Thresholds.MaxKVUsage <= 0 && c.Thresholds.MaxPendingPrefillTokens <= 0:
		return errors.New("thresholds: set at least one of maxWaiting, maxKvUsage, maxPendingPrefillTokens, or nothing is ever held")
	}
	for i, d := range c.DeadlineMs {
		if d < 1 || d > MaxDeadlineMs {
			return fmt.Errorf("deadlineMs.%s: use 1 to %d", Bands[i], MaxDeadlineMs)
		}
	}
	return nil
}

// Classify picks a request's class: the priority header (PriorityHeader) when
// present, else the model's default, else the path's, else DefaultClass. A
// malformed header is an error the client should see (400), not a silent
// default.
func (c *Config) Classify(header, path, model string) (Class, error) {
	if header != "" {
		return ParseClass(header)
	}
	if cl, ok := c.ModelClasses[model]; ok && model != "" {
		return cl, nil
	}
	if cl, ok := c.PathClasses[path]; ok {
		return cl, nil
	}
	return c.DefaultClass, nil
}

// Deadline is the absolute deadline (ms) of a request that arrived at
// nowMs: the deadline header's value (milliseconds from arrival, 1 to
// MaxDeadlineMs) when present, else the class default.
func (c *Config) Deadline(class Class, header string, nowMs int64) (int64, error) {
	if header == "" {
		return nowMs + int64(c.DeadlineMs[class.Band()]), nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(header))
	if err != nil || n < 1 || n > MaxDeadlineMs {
		return 0, fmt.Errorf("deadline %q: use milliseconds from 1 to %d", header, MaxDeadlineMs)
	}
	return nowMs + int64(n), nil
}
