package wasmhost_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/kvroute/kvroute/internal/sim/wasmhost"
)

// ExampleNew runs kvroute.router in front of one engine and reads what the
// filter did. (Compiled, not run: it needs dist/kvroute.wasm.)
func ExampleNew() {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"choices":[{"text":"hi"}]}`)
	}))
	defer engine.Close()
	addr := engine.Listener.Addr().String()

	h, err := wasmhost.New(context.Background(), wasmhost.Config{
		ModulePath: "dist/kvroute.wasm",
		VMID:       "kvroute",
		Filters: []wasmhost.Filter{{
			RootID:                      "kvroute.router",
			Configuration:               fmt.Sprintf(`{"endpoints":[{"address":%q}]}`, addr),
			AllowOnHeadersStopIteration: true, // body routing, as in the shipped Envoy configs
		}},
		Clusters:     map[string][]string{"engines": {addr}},
		RouteCluster: "engines",
	})
	var startErr *wasmhost.PluginStartError
	if errors.As(err, &startErr) {
		log.Fatalf("the filter rejected its configuration: %v", startErr.ModuleLog)
	} else if err != nil {
		log.Fatal(err)
	}
	defer h.Close()

	front := httptest.NewServer(h)
	defer front.Close()
	resp, err := http.Post(front.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"hello"}`))
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, h.CounterValue("kvroute.router.requests.routed"), h.UpstreamRequests()[addr])
}
