package metricsvc

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/snapshot"
)

// Pulling gateways (state.pull: header-only gateways cannot take pushes)
// read GET /state about once a second, while pushes go out on every
// report. So that a pull carries every route and removal pushed since the
// gateway's previous pull, and not only the last push's, the service keeps
// a log of what it pushed, numbered by push, and answers
// /state?since=<cursor> with the last snapshot whose routes and removals
// are those logged after the cursor, and the cursor to ask from next.
//
// Scope: one service instance. A cursor names the instance it came from
// (a random id made at start): asked with another instance's cursor (a
// second replica, a restart) the service answers with its whole log, and
// the gateway applies a few routes and removals twice, which marks blocks
// already marked and clears bits already clear. The log keeps at most
// pullLogRoutes routes and pullLogRemovals removals and nothing older than
// pullLogAge: a gateway that pulled less recently misses the rest, as it
// would a lost push.
const (
	pullLogRoutes   = 20_000
	pullLogRemovals = 20_000
	pullLogAge      = time.Minute
)

// pullLog is what the service pushed, for pulling gateways.
type pullLog struct {
	mu       sync.Mutex
	id       string // this instance's cursor prefix
	seq      uint64 // pushes logged
	reports  []loggedReport
	removals []loggedRemoval
	nRoutes  int
}

type loggedReport struct {
	seq uint64
	at  time.Time
	r   snapshot.GatewayReport // routes only
}

type loggedRemoval struct {
	seq uint64
	at  time.Time
	r   snapshot.Removal
}

func newPullLog() *pullLog {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &pullLog{id: hex.EncodeToString(b[:])}
}

// add logs one push's routes and removals and returns its sequence
// number (its cursor's number).
func (l *pullLog) add(st *snapshot.State, now time.Time) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	for _, g := range st.Gateways {
		if len(g.Routes) > 0 {
			l.reports = append(l.reports, loggedReport{l.seq, now, snapshot.GatewayReport{Gateway: g.Gateway, TimestampMs: g.TimestampMs, Routes: g.Routes}})
			l.nRoutes += len(g.Routes)
		}
	}
	for _, r := range st.Removals {
		l.removals = append(l.removals, loggedRemoval{l.seq, now, r})
	}
	n := 0
	for n < len(l.reports) && (l.nRoutes-len(l.reports[n].r.Routes) >= pullLogRoutes || now.Sub(l.reports[n].at) > pullLogAge) && n < len(l.reports)-1 {
		l.nRoutes -= len(l.reports[n].r.Routes)
		n++
	}
	clear(l.reports[:n])
	l.reports = append(l.reports[:0], l.reports[n:]...)
	n = 0
	for n < len(l.removals) && (len(l.removals)-n > pullLogRemovals || now.Sub(l.removals[n].at) > pullLogAge) {
		n++
	}
	clear(l.removals[:n])
	l.removals = append(l.removals[:0], l.removals[n:]...)
	return l.seq
}

func (l *pullLog) cursor() string { return l.id + "." + strconv.FormatUint(l.seq, 10) }

// since answers a pull that gave cursor: st (the last snapshot) with the
// routes and removals logged after cursor (all of them for another
// instance's cursor) and this instance's cursor. Without a cursor, st as
// it was pushed.
func (l *pullLog) since(st snapshot.State, cursor string) snapshot.State {
	l.mu.Lock()
	defer l.mu.Unlock()
	if cursor == "" {
		// No cursor (a gateway's first pull, a person): the last push as
		// it went out.
		st.Cursor = l.cursor()
		return st
	}
	after := uint64(0)
	if id, n, ok := strings.Cut(cursor, "."); ok && id == l.id {
		if v, err := strconv.ParseUint(n, 10, 64); err == nil && v <= l.seq {
			after = v
		}
	}
	out := l.after(st, after)
	out.Cursor = l.cursor()
	return out
}

// after returns st with the routes and removals logged after push number
// n in place of its own: what a gateway whose last push was the n-th
// missed. The caller holds l.mu.
func (l *pullLog) after(st snapshot.State, after uint64) snapshot.State {
	out := st
	out.Gateways = nil
	for _, g := range st.Gateways {
		if len(g.Routes) == 0 {
			out.Gateways = append(out.Gateways, g) // load pictures: the newest are in the last push
		}
	}
	for _, r := range l.reports {
		if r.seq > after {
			out.Gateways = append(out.Gateways, r.r)
		}
	}
	out.Removals = nil
	for _, r := range l.removals {
		if r.seq > after {
			out.Removals = append(out.Removals, r.r)
		}
	}
	return out
}

// sinceSeq is since for a pushed gateway whose last delivered push was
// the n-th (push.Pusher.Publish): st with what it skipped, without a
// cursor (it does not pull).
func (l *pullLog) sinceSeq(st snapshot.State, n uint64) snapshot.State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.after(st, n)
}
