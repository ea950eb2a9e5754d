package push

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
)

// fakeGateway checks the bearer token like the router's state endpoint and
// records what it accepted.
type fakeGateway struct {
	token  string
	mu     sync.Mutex
	bodies []string
	status atomic.Int64 // forced status when non-zero
	delay  atomic.Int64 // ns
	// release ends delayed handlers at cleanup
	release chan struct{}
	srv     *httptest.Server
}

func newGateway(t *testing.T, token string) *fakeGateway {
	g := &fakeGateway{token: token, release: make(chan struct{})}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if d := g.delay.Load(); d > 0 {
			select {
			case <-time.After(time.Duration(d)):
			case <-r.Context().Done():
				return
			case <-g.release:
				return
			}
		}
		if r.Method != http.MethodPost || r.URL.Path != "/.kvroute/v1/state" {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+g.token {
			http.Error(w, "bad token", http.StatusUnauthorized)
			return
		}
		if s := g.status.Load(); s != 0 {
			http.Error(w, "forced", int(s))
			return
		}
		g.mu.Lock()
		g.bodies = append(g.bodies, string(b))
		g.mu.Unlock()
	}))
	t.Cleanup(g.srv.Close)
	t.Cleanup(func() { close(g.release) }) // runs first: unblocks slow handlers
	return g
}

func (g *fakeGateway) url() string { return g.srv.URL + "/.kvroute/v1/state" }

func (g *fakeGateway) last() (string, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.bodies) == 0 {
		return "", 0
	}
	return g.bodies[len(g.bodies)-1], len(g.bodies)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestPushTokenAndIsolation(t *testing.T) {
	good := newGateway(t, "s3cret")
	wrongTok := newGateway(t, "other")
	failing := newGateway(t, "s3cret")
	failing.status.Store(500)
	slow := newGateway(t, "s3cret")
	slow.delay.Store(int64(time.Hour))
	newer := newGateway(t, "s3cret") // holds a newer snapshot: refuses with 409
	newer.status.Store(409)

	p := New([]string{slow.url(), failing.url(), wrongTok.url(), good.url(), newer.url()}, StaticToken("s3cret"), nil, quiet())
	p.Timeout = 3 * time.Second
	// Backoff stays short, so the failing gateway retries within a fraction
	// of a second of its recovery however long the steps before took.
	p.MinBackoff, p.MaxBackoff = 20*time.Millisecond, 100*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()

	p.Publish(0, []byte(`{"v":1}`), nil)
	testenv.WaitFor(t, "good gateway", func() bool { b, _ := good.last(); return b == `{"v":1}` })
	// The slow gateway's push ends only at the 3 s timeout: serialized
	// behind it, the good gateway would get its push after that failure.
	if st := p.Stats()[0]; st.OK != 0 || st.Failed != 0 {
		t.Errorf("good gateway got the push only after the slow one's ended (%+v): the slow one delayed it", st)
	}
	p.Publish(0, []byte(`{"v":2}`), nil)
	testenv.WaitFor(t, "second push", func() bool { b, _ := good.last(); return b == `{"v":2}` })

	testenv.WaitWithin(t, 10*time.Second, "failures counted", func() bool {
		st := p.Stats()
		return st[0].FailedBy["timeout"] >= 1 && st[1].FailedBy["status"] >= 2 && st[2].FailedBy["unauthorized"] >= 2 && st[4].FailedBy["older"] >= 2
	})
	st := p.Stats()
	if st[3].OK < 2 || st[3].Failed != 0 {
		t.Errorf("good gateway stats = %+v", st[3])
	}
	if st[2].OK != 0 {
		t.Errorf("wrong-token gateway accepted a push: %+v", st[2])
	}
	// The failing gateway recovers and gets the newest state, not a stale one.
	failing.status.Store(0)
	testenv.WaitFor(t, "recovery", func() bool { b, _ := failing.last(); return b == `{"v":2}` })
	if _, n := failing.last(); n != 1 {
		t.Errorf("recovered gateway got %d pushes, want only the newest", n)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Run did not return")
	}
}

func TestPushRetriesWithoutNewPublish(t *testing.T) {
	g := newGateway(t, "t")
	g.status.Store(503)
	p := New([]string{g.url()}, StaticToken("t"), nil, quiet())
	// A low cap keeps the retry after the gateway recovers prompt however
	// many failures a loaded machine lets pile up before the check sees 3.
	p.MinBackoff, p.MaxBackoff = 10*time.Millisecond, 40*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)
	p.Publish(0, []byte("x"), nil)
	testenv.WaitWithin(t, 10*time.Second, "a few failures", func() bool { return p.Stats()[0].Failed >= 3 })
	g.status.Store(0)
	// The gateway records the body before its answer reaches the pusher:
	// wait for the pusher's own count of the success.
	testenv.WaitWithin(t, 10*time.Second, "delivery after backoff", func() bool { return p.Stats()[0].OK >= 1 })
	if st := p.Stats()[0]; st.Consecutive != 0 || st.OK != 1 {
		t.Errorf("stats = %+v", st)
	}
	if _, n := g.last(); n != 1 {
		t.Errorf("the gateway accepted %d pushes, want 1", n)
	}
}

func TestFileTokenRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ft := &FileToken{Path: path}
	if tok, err := ft.Token(); err != nil || tok != "first" {
		t.Fatalf("token = %q, %v", tok, err)
	}
	if err := os.WriteFile(path, []byte("second-longer"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, _ := ft.Token(); tok != "second-longer" {
		t.Errorf("rotated token = %q", tok)
	}
	os.WriteFile(path, []byte("  \n"), 0o600)
	if _, err := ft.Token(); err == nil {
		t.Error("empty token file accepted")
	}
	if _, err := (&FileToken{Path: path + ".missing"}).Token(); err == nil {
		t.Error("missing token file accepted")
	}
	if _, err := StaticToken("").Token(); err == nil {
		t.Error("empty static token accepted")
	}
}

// TestBackoffGrowsCapsAndResets records every wait the pusher asks for
// (without sleeping through them): after each failure the wait doubles
// from MinBackoff up to MaxBackoff and stays there, and a success puts it
// back to MinBackoff for the next failure.
func TestBackoffGrowsCapsAndResets(t *testing.T) {
	g := newGateway(t, "t")
	g.status.Store(503)
	p := New([]string{g.url()}, StaticToken("t"), nil, quiet())
	// The defaults (100 ms doubling to 10 s) are what is checked.

	const failuresBeforeRecovery = 9
	var (
		mu    sync.Mutex
		waits []time.Duration
	)
	p.after = func(d time.Duration) <-chan time.Time {
		mu.Lock()
		defer mu.Unlock()
		waits = append(waits, d)
		if len(waits) == failuresBeforeRecovery {
			g.status.Store(0) // the retry after this wait succeeds
		}
		if len(waits) > failuresBeforeRecovery {
			return nil // the failure after recovery: wait until the test ends
		}
		ch := make(chan time.Time, 1)
		ch <- time.Now()
		return ch
	}
	recorded := func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Duration(nil), waits...)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)
	p.Publish(0, []byte("first"), nil)
	testenv.WaitWithin(t, 5*time.Second, "delivery after the failures", func() bool { _, n := g.last(); return n == 1 })

	ms := time.Millisecond
	want := []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 6400 * ms, 10 * time.Second, 10 * time.Second}
	if got := recorded(); !slices.Equal(got, want) {
		t.Fatalf("waits before recovery = %v, want %v", got, want)
	}
	if st := p.Stats()[0]; st.Failed != failuresBeforeRecovery || st.OK != 1 || st.Consecutive != 0 {
		t.Errorf("stats after recovery = %+v", st)
	}

	// Fail again: the wait starts over at 100 ms, not at the 10 s cap.
	g.status.Store(503)
	p.Publish(0, []byte("second"), nil)
	testenv.WaitWithin(t, 5*time.Second, "the next failure's wait", func() bool { return len(recorded()) > failuresBeforeRecovery })
	if got := recorded()[failuresBeforeRecovery]; got != 100*ms {
		t.Errorf("wait after a success then a failure = %v, want 100ms (reset)", got)
	}
}

// A gateway still taking one push when two more are published gets, with
// the newest, the deltas of the one it skipped (Publish's since), and
// a gateway that skipped nothing gets the snapshot as published.
func TestPushCatchesUpSkippedDeltas(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	entered, gate := make(chan struct{}, 8), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if string(b) == "6" { // a newer snapshot is in force: refused, its deltas taken
			mu.Lock()
			bodies = append(bodies, "6 refused")
			mu.Unlock()
			http.Error(w, "older", http.StatusConflict)
			return
		}
		if string(b) == "2" { // held until the test has published 3 and 4
			entered <- struct{}{}
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
	}))
	defer srv.Close()
	got := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(bodies)
	}
	p := New([]string{srv.URL}, StaticToken("t"), nil, quiet())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)
	publish := func(seq uint64) {
		body := strconv.FormatUint(seq, 10)
		p.Publish(seq, []byte(body), func(n uint64) []byte { return []byte(body + " since " + strconv.FormatUint(n, 10)) })
	}
	publish(1)
	testenv.WaitFor(t, "the first push", func() bool { return len(got()) == 1 })
	publish(2)
	<-entered // the gateway is taking push 2
	publish(3)
	publish(4)
	close(gate)
	testenv.WaitFor(t, "the pushes after the held one", func() bool { return len(got()) == 3 })
	publish(5)
	testenv.WaitFor(t, "the next push", func() bool { return len(got()) == 4 })
	// A push refused as older (409) was taken for its deltas: the one after
	// it goes as published.
	publish(6)
	testenv.WaitFor(t, "the refused push", func() bool { return len(got()) >= 5 })
	publish(7)
	testenv.WaitFor(t, "the push after the refused one", func() bool { b := got(); return b[len(b)-1] != "6 refused" })
	b := got()
	if want := []string{"1", "2", "4 since 2", "5", "6 refused"}; !slices.Equal(b[:5], want) || b[len(b)-1] != "7" {
		t.Errorf("gateway got %q, want %q, then 6 refused again until 7 went as published", b, want)
	}
	if st := p.Stats()[0]; st.CaughtUp != 1 || st.OK != 5 {
		t.Errorf("stats %+v, want 5 pushes, 1 caught up", st)
	}
}
