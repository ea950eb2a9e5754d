package filter

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/internal/wasmhost"
)

// floorModule builds testdata/floor, the baseline BenchmarkRouterInWasm
// measures kvroute.router against (a few seconds the first time; the Go
// build cache makes later builds instant).
func floorModule(t testing.TB) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "floor.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "./testdata/floor")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building testdata/floor: %v: %s", err, msg)
	}
	m, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestFloorModuleRoutesOnTheWholeBody checks that the benchmark's baseline
// does the work it stands for: it holds the headers until the whole body is
// buffered (the upstream sees every byte, the body arriving in several
// chunks) and sets the destination header, round robin, that the host
// honours.
func TestFloorModuleRoutesOnTheWholeBody(t *testing.T) {
	var mu sync.Mutex
	got := map[string][]int{} // upstream address -> body sizes it received
	var addrs []string
	for i := 0; i < 2; i++ {
		var self string
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			defer mu.Unlock()
			if d := r.Header.Get("x-gateway-destination-endpoint"); d != self {
				t.Errorf("upstream %s got destination header %q", self, d)
			}
			got[self] = append(got[self], len(b))
		}))
		t.Cleanup(up.Close)
		self = up.Listener.Addr().String()
		addrs = append(addrs, self)
	}
	h, err := wasmhost.New(context.Background(), wasmhost.Config{Module: floorModule(t), VMID: "floor",
		Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines",
		Filters: []wasmhost.Filter{{RootID: "floor", AllowOnHeadersStopIteration: true, Configuration: strings.Join(addrs, ",")}}})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(h)
	t.Cleanup(func() { front.Close(); h.Close() })
	const size = 32 << 10
	for i := 0; i < 4; i++ {
		// A pipe has no length: the client sends the body chunked, in pieces.
		pr, pw := io.Pipe()
		go func() {
			for j := 0; j < 4; j++ {
				pw.Write([]byte(strings.Repeat("a", size/4)))
			}
			pw.Close()
		}()
		resp, err := http.Post(front.URL+"/v1/chat/completions", "application/json", pr)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range addrs {
		if len(got[a]) != 2 || got[a][0] != size || got[a][1] != size {
			t.Errorf("upstream %s received bodies %v, want two of %d bytes (round robin over the whole body)", a, got[a], size)
		}
	}
}
