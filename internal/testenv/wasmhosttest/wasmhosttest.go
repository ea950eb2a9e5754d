// Package wasmhosttest starts a Wasm host (internal/sim/wasmhost) behind an
// httptest server for tests, as net/http/httptest does for a handler: the
// host and its front close with the test.
package wasmhosttest

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/kvroute/kvroute/internal/sim/wasmhost"
)

// Start runs cfg in a host with an HTTP front and returns the host and the
// front's URL; both close when tb ends. A host that fails to start fails
// tb with New's error, which quotes the module's log when a plugin refused
// its configuration.
func Start(tb testing.TB, cfg wasmhost.Config) (*wasmhost.Host, string) {
	tb.Helper()
	h, err := wasmhost.New(context.Background(), cfg)
	if err != nil { // a *PluginStartError quotes the module's log
		tb.Fatal(err)
	}
	front := httptest.NewServer(h)
	tb.Cleanup(func() {
		front.Close()
		h.Close()
	})
	return h, front.URL
}
