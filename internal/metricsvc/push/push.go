// Package push delivers the fleet snapshot to every gateway's state
// endpoint.
//
// Each gateway has its own goroutine and its own mailbox holding only the
// latest snapshot: a slow or dead gateway backs off and catches up with the
// newest state when it returns, and never delays the others or the
// producer. Publish never blocks.
package push

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/metricsvc/internal/ratelog"
)

// TokenSource yields the bearer token sent with each push.
type TokenSource interface {
	Token() (string, error)
}

// StaticToken is a fixed token (from the environment, say).
type StaticToken string

// Token implements TokenSource.
func (t StaticToken) Token() (string, error) {
	if t == "" {
		return "", errors.New("the state token is empty")
	}
	return string(t), nil
}

// FileToken reads the token from a file (a mounted Kubernetes Secret, say),
// re-reading it when the file changes so a rotated secret takes effect
// without a restart. Surrounding whitespace is trimmed.
type FileToken struct {
	Path string

	mu      sync.Mutex
	modTime time.Time
	size    int64
	token   string
}

// Token implements TokenSource.
func (f *FileToken) Token() (string, error) {
	st, err := os.Stat(f.Path)
	if err != nil {
		return "", fmt.Errorf("state token file: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.token != "" && st.ModTime().Equal(f.modTime) && st.Size() == f.size {
		return f.token, nil
	}
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return "", fmt.Errorf("state token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("state token file %s is empty", f.Path)
	}
	f.token, f.modTime, f.size = tok, st.ModTime(), st.Size()
	return tok, nil
}

// GatewayStats describes one gateway's delivery state.
type GatewayStats struct {
	URL        string
	OK, Failed uint64
	// Failures by reason: "connect", "timeout", "unauthorized", "older"
	// (the gateway holds a newer snapshot: 409), "status", "token".
	FailedBy map[string]uint64
	// Consecutive failures since the last success.
	Consecutive int
	LastOK      time.Time
	LastError   string
	// Latency of the last successful push.
	LastLatency time.Duration
	// CaughtUp counts pushes sent with the deltas of snapshots the gateway
	// had skipped (Publish's since).
	CaughtUp uint64
}

// Pusher fans snapshots out to gateways.
type Pusher struct {
	Client *http.Client
	Token  TokenSource
	// Timeout bounds one push (default 2 s).
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait after a failed push
	// (defaults 100 ms and 10 s, doubling).
	MinBackoff, MaxBackoff time.Duration
	Log                    *slog.Logger

	// after waits out a backoff; nil means time.After. Tests replace it to
	// see each wait without sleeping through it.
	after func(time.Duration) <-chan time.Time

	gws []*gateway
}

type gateway struct {
	url    string
	wake   chan struct{}
	mu     sync.Mutex
	body   []byte
	ver    uint64
	seq    uint64                    // the body's sequence number (Publish), 0 for none
	since  func(after uint64) []byte // the body with the deltas after a sequence number, or nil
	stats  GatewayStats
	logLim ratelog.Limiter
}

// New returns a Pusher for the given state URLs.
func New(urls []string, token TokenSource, client *http.Client, log *slog.Logger) *Pusher {
	if client == nil {
		client = &http.Client{}
	}
	if log == nil {
		log = slog.Default()
	}
	p := &Pusher{Client: client, Token: token, Log: log}
	for _, u := range urls {
		p.gws = append(p.gws, &gateway{url: u, wake: make(chan struct{}, 1),
			stats: GatewayStats{URL: u, FailedBy: map[string]uint64{}}})
	}
	return p
}

// Publish hands a new encoded snapshot to every gateway. It never blocks:
// a gateway still busy with an earlier push takes this one next, skipping
// any it had not started.
//
// A snapshot may carry deltas, changes that hold only in the push that
// carries them (the routes other gateways reported, evicted blocks): a
// gateway that skips a push, because it was still busy with an earlier
// one or failing, would never see that push's deltas. seq numbers the
// snapshot (1, 2, ... in publishing order), and since(n) encodes it with
// the deltas of every snapshot after the n-th too: a gateway whose last
// delivered snapshot was the n-th and which skipped some gets since(n)
// instead of body. A gateway that has had nothing yet gets body, as a
// gateway that starts later would. A snapshot without deltas passes 0
// and nil.
func (p *Pusher) Publish(seq uint64, body []byte, since func(n uint64) []byte) {
	for _, g := range p.gws {
		g.mu.Lock()
		g.body, g.seq, g.since = body, seq, since
		g.ver++
		g.mu.Unlock()
		select {
		case g.wake <- struct{}{}:
		default:
		}
	}
}

// Stats returns every gateway's delivery state.
func (p *Pusher) Stats() []GatewayStats {
	out := make([]GatewayStats, 0, len(p.gws))
	for _, g := range p.gws {
		g.mu.Lock()
		s := g.stats
		s.FailedBy = make(map[string]uint64, len(g.stats.FailedBy))
		for k, v := range g.stats.FailedBy {
			s.FailedBy[k] = v
		}
		g.mu.Unlock()
		out = append(out, s)
	}
	return out
}

// Run delivers until ctx is done.
func (p *Pusher) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, g := range p.gws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.deliver(ctx, g)
		}()
	}
	wg.Wait()
}

func (p *Pusher) deliver(ctx context.Context, g *gateway) {
	minB, maxB := p.MinBackoff, p.MaxBackoff
	if minB <= 0 {
		minB = 100 * time.Millisecond
	}
	if maxB <= 0 {
		maxB = 10 * time.Second
	}
	after := p.after
	if after == nil {
		after = time.After
	}
	backoff := minB
	var sent, sentSeq uint64 // the version and sequence number last delivered
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.wake:
		}
		g.mu.Lock()
		body, ver, seq, since := g.body, g.ver, g.seq, g.since
		g.mu.Unlock()
		if ver == sent || body == nil {
			continue
		}
		caughtUp := since != nil && sentSeq > 0 && seq > sentSeq+1
		if caughtUp {
			body = since(sentSeq) // the deltas of the snapshots skipped too
		}
		start := time.Now()
		reason, err := p.send(ctx, g.url, body)
		if ctx.Err() != nil {
			return
		}
		if err == nil || reason == "older" {
			// A gateway that holds a newer snapshot (another service
			// replica pushed it) refuses this one but takes its deltas
			// all the same: they are not sent to it again.
			sentSeq = seq
		}
		g.mu.Lock()
		if err == nil {
			if caughtUp {
				g.stats.CaughtUp++
			}
			g.stats.OK++
			g.stats.Consecutive = 0
			g.stats.LastOK = time.Now()
			g.stats.LastLatency = time.Since(start)
			g.mu.Unlock()
			if backoff > minB {
				p.Log.Info("gateway accepts state again", "gateway", g.url)
			}
			sent = ver
			backoff = minB
			continue
		}
		g.stats.Failed++
		g.stats.FailedBy[reason]++
		g.stats.Consecutive++
		g.stats.LastError = err.Error()
		g.mu.Unlock()
		g.logLim.Log(p.Log, slog.LevelWarn, reason, "state push failed", "gateway", g.url,
			"reason", reason, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-after(backoff):
		}
		backoff = min(backoff*2, maxB)
		// Retry with whatever is newest now, even if nothing new arrived.
		select {
		case g.wake <- struct{}{}:
		default:
		}
	}
}

func (p *Pusher) send(ctx context.Context, url string, body []byte) (reason string, err error) {
	tok, err := p.Token.Token()
	if err != nil {
		return "token", err
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "connect", fmt.Errorf("bad gateway state URL %q: %w", url, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := p.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return "timeout", err
		}
		return "connect", err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return "", nil
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return "unauthorized", fmt.Errorf("gateway refused the state token (%s): make the service's token match the gateway plugin's state token", resp.Status)
	case resp.StatusCode == http.StatusConflict:
		return "older", fmt.Errorf("gateway holds a newer snapshot than this one (%s): another metrics service pushes to it, or this host's clock runs behind the one that pushed it: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	return "status", fmt.Errorf("gateway answered %s: %s", resp.Status, strings.TrimSpace(string(msg)))
}
