// Package wasmhosttest starts the wazero host (internal/sim/wasmhost)
// behind an httptest server for tests, as net/http/httptest does for a
// handler: the host and its front close with the test.
package wasmhosttest

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
)

// Start runs cfg in a host with an HTTP front and returns the host and the
// front's URL; both close when tb ends. A host that fails to start fails
// tb with New's error, which quotes the module's log when a plugin refused
// its configuration.
func Start(tb testing.TB, cfg wasmhost.Config) (*wasmhost.Host, string) {
	tb.Helper()
	return StartContext(tb, context.Background(), cfg)
}

// StartContext is Start with the context New compiles the module with:
// one carrying a wazero function listener factory, for instance, sees
// every call the module makes.
func StartContext(tb testing.TB, ctx context.Context, cfg wasmhost.Config) (*wasmhost.Host, string) {
	tb.Helper()
	h, err := wasmhost.New(ctx, cfg)
	if err != nil { // a *PluginStartError quotes the module's log
		tb.Fatal(err)
	}
	return h, testenv.Serve(tb, h, h)
}
