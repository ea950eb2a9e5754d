// Package ratelog keeps repeated warnings from flooding the log. An engine
// scraped ten times a second that keeps sending bad input would otherwise
// write ten identical lines a second; counters carry the full count, the log
// carries the first occurrence and then one line per period with how many
// were suppressed.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Limiter passes at most one record per key per Period.
type Limiter struct {
	Period time.Duration

	mu   sync.Mutex
	last map[string]entry
	// now is the clock (tests); nil: time.Now.
	now func() time.Time
}

type entry struct {
	at         time.Time
	suppressed int
}

// Log writes the record unless one with the same key was written less than
// Period ago; a written record carries the number suppressed since the last.
func (l *Limiter) Log(log *slog.Logger, level slog.Level, key, msg string, args ...any) {
	now := time.Now()
	if l.now != nil {
		now = l.now()
	}
	l.mu.Lock()
	if l.last == nil {
		l.last = make(map[string]entry)
	}
	e := l.last[key]
	if !e.at.IsZero() && now.Sub(e.at) < l.period() {
		e.suppressed++
		l.last[key] = e
		l.mu.Unlock()
		return
	}
	l.last[key] = entry{at: now}
	l.mu.Unlock()
	if e.suppressed > 0 {
		args = append(args, "suppressed", e.suppressed)
	}
	log.Log(context.Background(), level, msg, args...)
}

func (l *Limiter) period() time.Duration {
	if l.Period <= 0 {
		return 10 * time.Second
	}
	return l.Period
}
