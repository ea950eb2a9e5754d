package filter

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/internal/testenv"
)

// In the module the request header map is read into the router's lent
// buffer and walked in place (filter/headers_host.go); a map larger than
// that buffer is read again through the SDK. Either way the client's
// routing headers are stripped, the session header is kept, and the
// request is routed; a normal request afterwards finds the buffer intact.
func TestWasmRequestHeaderMapInPlaceAndTooLarge(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		io.WriteString(w, `{"choices":[]}`)
	}))
	defer up.Close()
	h, url := startRouter(t, []string{up.Listener.Addr().String()}, 1, `,"fallbacks":0,"strategy":"sticky_session"`)
	spoofed := map[string]string{
		"x-gateway-destination-endpoint": "169.254.169.254:80",
		"x-kvroute-prefill-host":         "169.254.169.254:80",
		"x-session-id":                   "tenant-7",
	}
	for i, extra := range []int{0, hostValSize + 4<<10, 0} {
		hdr := map[string]string{"x-padding": strings.Repeat("p", extra)}
		for k, v := range spoofed {
			hdr[k] = v
		}
		if code, b, _ := testenv.Call(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"x","max_tokens":1}`, hdr); code != 200 {
			t.Fatalf("request %d (%d bytes of padding): %d %s", i, extra, code, b)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 {
		t.Fatalf("the engine saw %d requests, want 3", len(seen))
	}
	for i, hs := range seen {
		if got := hs.Get("x-gateway-destination-endpoint"); got != up.Listener.Addr().String() {
			t.Errorf("request %d: destination %q, want only the filter's choice", i, got)
		}
		if got := hs.Get("x-kvroute-prefill-host"); got != "" {
			t.Errorf("request %d: internal header reached the engine: %q", i, got)
		}
		if got := hs.Get("x-session-id"); got != "tenant-7" {
			t.Errorf("request %d: session header %q, want it forwarded", i, got)
		}
	}
	if h.VMFailures() != 0 {
		t.Errorf("VM failures: %d", h.VMFailures())
	}
}
