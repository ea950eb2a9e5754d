package testenv

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ModulePath is the path of the filter module the Wasm tests load:
// $KVROUTE_WASM when set (to measure a build of one's own while others
// rebuild dist/), else dist/kvroute.wasm at the repository root. A missing
// module fails tb with the command that builds it.
func ModulePath(tb testing.TB) string {
	tb.Helper()
	path := os.Getenv("KVROUTE_WASM")
	if path == "" {
		path = filepath.Join(RepoRoot(tb), "dist", "kvroute.wasm")
	}
	if _, err := os.Stat(path); err != nil {
		tb.Fatalf("%s is missing (%v): run `make wasm` (make test builds it first)", path, err)
	}
	return path
}

// modules holds each module read, by path: a test binary reads a 5 MB
// module once however many tests load it.
var modules sync.Map

// Module returns the bytes of the module at ModulePath.
func Module(tb testing.TB) []byte {
	tb.Helper()
	path := ModulePath(tb)
	if b, ok := modules.Load(path); ok {
		return b.([]byte)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	modules.Store(path, b)
	return b
}

// RepoRoot is the directory of the go.mod above the test's working
// directory (a test runs in its package's directory).
func RepoRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			tb.Fatalf("no go.mod above %s", dir)
		}
	}
}

// Poll calls cond every 5 ms until it holds or d has passed, and reports
// whether it held. The caller says what it waited for when it did not.
func Poll(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return cond()
		}
	}
	return true
}

// LockedBuffer is what another goroutine writes (a logger, a command's
// output) and a test reads while it runs.
type LockedBuffer struct {
	// Max, when above 0, keeps only the first Max bytes written: the
	// output of a process that runs for the whole test (a host's stderr).
	Max int

	mu sync.Mutex
	b  strings.Builder
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Max > 0 && l.b.Len()+len(p) > l.Max {
		l.b.Write(p[:max(0, l.Max-l.b.Len())])
		return len(p), nil
	}
	return l.b.Write(p)
}

// String is everything written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// WaitTimeout bounds WaitFor: long enough for a loaded 2-core machine,
// short enough that a condition that never holds fails the test soon.
const WaitTimeout = 10 * time.Second

// WaitFor polls cond for up to WaitTimeout and fails tb, naming what it
// waited for, when cond never held.
func WaitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	WaitWithin(tb, WaitTimeout, what, cond)
}

// WaitWithin is WaitFor with a bound of the test's own, for a test whose
// assertion is that something happens within d.
func WaitWithin(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Poll(d, cond) {
		tb.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// FatalMessage runs f with a testing.TB that records what f fails it
// with (Fatal, Fatalf) and returns that message, "" when f returned: the
// test of a helper that fails its test.
func FatalMessage(t testing.TB, f func(tb testing.TB)) string {
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(rec)
	}()
	<-done
	return rec.msg
}

// fatalRecorder is a testing.TB whose Fatal and Fatalf record the message
// and end the goroutine, as testing.T's do.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatal(args ...any) {
	r.msg = fmt.Sprint(args...)
	runtime.Goexit()
}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// Serve puts h behind an httptest server and returns its URL. When tb
// ends the server closes, then c (the handler's own resources; nil for
// none), so that no request reaches a closed handler.
func Serve(tb testing.TB, h http.Handler, c io.Closer) string {
	front := httptest.NewServer(h)
	tb.Cleanup(func() {
		front.Close()
		if c != nil {
			c.Close()
		}
	})
	return front.URL
}

// Client is the HTTP client of Call: a bound on every request, so that a
// host that never answers fails the test instead of hanging it.
var Client = &http.Client{Timeout: 20 * time.Second}

// Call sends one request (a JSON content type, then hdr) and returns the
// status, the body and the headers; a transport error fails tb.
func Call(tb testing.TB, method, url, body string, hdr map[string]string) (int, string, http.Header) {
	tb.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	if body == "" {
		req.Body = http.NoBody
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := Client.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// Drain reads and closes resp's body and returns its status; err (the
// request's) fails tb.
func Drain(tb testing.TB, resp *http.Response, err error) int {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// Clock is a wall clock a test moves itself: for wasmhost.Config.Clock (the
// proxy's time) and for the clocks the metrics service's parts take in
// tests. It stands still between calls to Advance, so what code computes
// from the time (which recency bucket a record falls in, whether a pushed
// state is stale, whether an interval or a lag passed) is exact however
// slow the machine, and a test steps through seconds at once. Safe for
// concurrent use: the host reads it from every worker.
type Clock struct{ nanos atomic.Int64 }

// NewClock returns a Clock reading start.
func NewClock(start time.Time) *Clock {
	c := &Clock{}
	c.nanos.Store(start.UnixNano())
	return c
}

// Now is the clock's reading; pass it (c.Now) where a clock is taken.
func (c *Clock) Now() time.Time { return time.Unix(0, c.nanos.Load()) }

// Advance moves the clock d forward and returns the new reading.
func (c *Clock) Advance(d time.Duration) time.Time { return time.Unix(0, c.nanos.Add(int64(d))) }
