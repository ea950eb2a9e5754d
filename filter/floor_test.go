package filter

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tetratelabs/wazero/experimental"

	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
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

// coldFloorModule builds testdata/floor with n generated functions that every
// routed body runs, one after the other: the floor plus a known amount of code
// that a request enters once, as kvroute.router's code is entered.
// BenchmarkRouterInWasm's "8Ktok/floor+cold" measures what that code costs per
// request in the host, so the cost model in docs/performance.md (a request
// pays for the code it enters, not for its arithmetic) is measured rather than
// inferred. Each function is 24 straight-line steps, each reading a byte of
// the body (a bounds check and a memory access, like most Go code); it returns
// the module and the Wasm bytes the generated code adds.
func coldFloorModule(t testing.TB, n int) ([]byte, int) {
	t.Helper()
	dir := t.TempDir()
	src, err := os.ReadFile("testdata/floor/main.go")
	if err != nil {
		t.Fatal(err)
	}
	var gen strings.Builder
	gen.WriteString("//go:build wasip1\n\npackage main\n\nfunc init() { touch = coldTouch }\n\n")
	gen.WriteString("func coldTouch(b []byte) (x uint64) {\n\tif len(b) < 256 {\n\t\treturn 0\n\t}\n")
	for i := range n {
		fmt.Fprintf(&gen, "\tx = cold%d(b, x)\n", i)
	}
	gen.WriteString("\treturn x\n}\n")
	// A fixed linear congruential sequence: the same code on every run.
	seed := uint64(1)
	next := func(k uint64) uint64 {
		seed = seed*6364136223846793005 + 1442695040888963407
		return (seed >> 33) % k
	}
	for i := range n {
		fmt.Fprintf(&gen, "\n//go:noinline\nfunc cold%d(b []byte, x uint64) uint64 {\n", i)
		for range 24 {
			fmt.Fprintf(&gen, "\tx = (x^uint64(b[%d]))*%d + x>>%d\n", next(256), 2*next(1<<40)+1, 1+next(62))
		}
		gen.WriteString("\treturn x\n}\n")
	}
	for name, data := range map[string][]byte{
		"go.mod":  []byte("module coldfloor\n\ngo 1.26\n"),
		"main.go": src,
		"cold.go": []byte(gen.String()),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "cold.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=mod")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the cold-code floor: %v: %s", err, msg)
	}
	m, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	codeBytes := func(m []byte) (total int) {
		_, sizes := wasmCodeSizes(t, m)
		for _, s := range sizes {
			total += s
		}
		return total
	}
	return m, codeBytes(m) - codeBytes(floorModule(t))
}

// TestColdFloorRunsItsCode checks that the cold-code floor does what the
// benchmark says: a routed request enters every generated function once,
// and the request is still routed.
func TestColdFloorRunsItsCode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Wasm module")
	}
	const n = 40
	module, added := coldFloorModule(t, n)
	if added < n*500 {
		t.Fatalf("the %d generated functions add %d bytes of Wasm, want at least %d", n, added, n*500)
	}
	addrs := jsonUpstreams(t, 2, `{"ok":true}`)
	counter := &codeCounter{entered: map[uint32]bool{}, byTop: map[string]map[uint32]bool{}, names: map[uint32]string{}}
	ctx := experimental.WithFunctionListenerFactory(context.Background(), counter)
	_, url := wasmhosttest.StartContext(t, ctx, wasmhost.Config{Module: module, VMID: "cold", Workers: 1, CompilationCacheDir: "-",
		Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines",
		Filters: []wasmhost.Filter{{RootID: "floor", AllowOnHeadersStopIteration: true, Configuration: strings.Join(addrs, ",")}}})
	body := chatBody(strings.Repeat("cold code ", 100), "q")
	counter.take()
	if code, msg, _ := testenv.Call(t, "POST", url+"/v1/chat/completions", body, nil); code != 200 {
		t.Fatalf("status %d: %s", code, msg)
	}
	_, _, byTop := counter.take()
	if got := len(byTop["proxy_on_request_body"]); got < n+1 {
		t.Errorf("the body callback entered %d functions, want the %d generated ones and their caller", got, n)
	}
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
	// Streams dealt to the workers in turn: each worker's round robin then
	// sees two of the four, whatever connections the client opens.
	_, url := wasmhosttest.Start(t, wasmhost.Config{Module: floorModule(t), VMID: "floor", Workers: 2, Dispatch: wasmhost.DispatchStream,
		Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines",
		Filters: []wasmhost.Filter{{RootID: "floor", AllowOnHeadersStopIteration: true, Configuration: strings.Join(addrs, ",")}}})
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
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", pr)
		if code := testenv.Drain(t, resp, err); code != 200 {
			t.Fatalf("status %d", code)
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
