package wasmhost

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/kvroute/kvroute/internal/testenv"
)

var (
	probeOnce sync.Once
	probeWasm []byte
	probeErr  error
)

// TestMain builds and compiles the probe module in the background while
// the first tests compile dist/kvroute.wasm: wazero compiles one module on
// one core, and the machine has two.
func TestMain(m *testing.M) {
	go func() {
		buildProbe()
		if probeErr != nil {
			return
		}
		ctx := context.Background()
		r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCompilationCache(compilationCache("")))
		defer r.Close(ctx)
		_, _ = r.CompileModule(ctx, probeWasm)
	}()
	os.Exit(m.Run())
}

// probeModule builds testdata/probe, a raw-ABI module that reports what
// the host lets it see, once per test process.
func probeModule(t testing.TB) []byte {
	t.Helper()
	buildProbe()
	if probeErr != nil {
		t.Fatal(probeErr)
	}
	return probeWasm
}

func buildProbe() {
	probeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "wasmhost-probe")
		if err != nil {
			probeErr = err
			return
		}
		out := filepath.Join(dir, "probe.wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "./testdata/probe")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if msg, err := cmd.CombinedOutput(); err != nil {
			probeErr = errors.New("building testdata/probe: " + err.Error() + ": " + string(msg))
			return
		}
		probeWasm, probeErr = os.ReadFile(out)
		os.RemoveAll(dir)
	})
}

// upstream is a loopback HTTP server that counts its requests and records
// the last request headers.
type upstream struct {
	srv      *httptest.Server
	addr     string
	requests atomic.Int64
	mu       sync.Mutex
	last     http.Header
	lastBody []byte
}

func newUpstream(t testing.TB, handler http.HandlerFunc) *upstream {
	u := &upstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.requests.Add(1)
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.last = r.Header.Clone()
		u.lastBody = body
		u.mu.Unlock()
		if handler != nil {
			handler(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-1","choices":[{"text":"ok"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	}))
	t.Cleanup(u.srv.Close)
	u.addr = u.srv.Listener.Addr().String()
	return u
}

func (u *upstream) lastHeader(k string) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.last == nil {
		return ""
	}
	return u.last.Get(k)
}

// startHost starts a host and an HTTP front for it, closed with the test.
func startHost(t testing.TB, cfg Config) (*Host, string) {
	t.Helper()
	h, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h, testenv.Serve(t, h, h)
}

type result struct {
	code   int
	body   string
	header http.Header
}

func do(t testing.TB, method, url, body string, hdr map[string]string) result {
	t.Helper()
	code, b, h := testenv.Call(t, method, url, body, hdr)
	return result{code, b, h}
}
