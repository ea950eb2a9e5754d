package scrape

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Result is the outcome of one scrape of one engine.
type Result struct {
	Address string
	Sample  Sample
	// Err is nil on success. Reason classifies a failure for metrics:
	// "connect", "timeout", "status", "parse", "not_engine", "too_large".
	Err      error
	Reason   string
	At       time.Time
	Duration time.Duration
}

// Loop scrapes one engine at a fixed interval and reports every result.
// Scrapes of one engine never overlap: a scrape slower than the interval
// delays the next tick rather than stacking requests on a struggling engine.
type Loop struct {
	Client  *http.Client
	Address string // host:port, as reported in results
	URL     string // the engine's metrics URL
	// Interval between scrapes; Timeout bounds one scrape. Keep Timeout
	// below Interval so a silent engine is noticed within two intervals.
	Interval, Timeout time.Duration
	Report            func(Result)

	parser Parser
}

// Run scrapes until ctx is done; the first scrape is immediate.
func (l *Loop) Run(ctx context.Context) {
	t := time.NewTicker(l.Interval)
	defer t.Stop()
	for {
		r := l.Once(ctx)
		if ctx.Err() != nil {
			return
		}
		l.Report(r)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Once performs one scrape.
func (l *Loop) Once(ctx context.Context) Result {
	start := time.Now()
	r := Result{Address: l.Address}
	r.Sample, r.Reason, r.Err = l.fetch(ctx)
	r.At = time.Now()
	r.Duration = r.At.Sub(start)
	return r
}

func (l *Loop) fetch(ctx context.Context) (Sample, string, error) {
	ctx, cancel := context.WithTimeout(ctx, l.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.URL, nil)
	if err != nil {
		return Sample{}, "connect", fmt.Errorf("bad metrics URL %q: %w", l.URL, err)
	}
	// The classic text format: what vLLM and SGLang serve by default, and
	// the one the parser reads.
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := l.Client.Do(req)
	if err != nil {
		return Sample{}, classify(ctx, err), err
	}
	defer func() {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // keep the connection reusable
		resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return Sample{}, "status", fmt.Errorf("GET %s: %s", l.URL, resp.Status)
	}
	s, err := l.parser.Parse(resp.Body)
	switch {
	case err == nil:
		return s, "", nil
	case errors.Is(err, ErrNoEngineMetrics):
		return s, "not_engine", err
	case errors.Is(err, ErrTooLarge):
		return s, "too_large", err
	case ctx.Err() != nil:
		return s, "timeout", fmt.Errorf("reading %s: %w", l.URL, ctx.Err())
	}
	return s, "parse", err
}

func classify(ctx context.Context, err error) string {
	var ne net.Error
	if ctx.Err() != nil || (errors.As(err, &ne) && ne.Timeout()) {
		return "timeout"
	}
	return "connect"
}
