package wasmhosttest

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
)

// A plugin that refuses its configuration fails the test with the
// plugin's name and the module's log, which says what to fix.
func TestStartQuotesTheModuleLogWhenAPluginRefuses(t *testing.T) {
	mod := testenv.Module(t)
	msg := testenv.FatalMessage(t, func(tb testing.TB) {
		Start(tb, wasmhost.Config{Module: mod, VMID: "kvroute",
			Filters:  []wasmhost.Filter{{RootID: "kvroute.router", Configuration: `{"endpoints":[{"address":"127.0.0.1:1"}],"strategy":"no_such_strategy"}`}},
			Clusters: map[string][]string{"engines": {"127.0.0.1:1"}}, RouteCluster: "engines"})
		t.Error("Start returned for a configuration the router refuses")
	})
	if !strings.Contains(msg, "kvroute.router") || !strings.Contains(msg, "no_such_strategy") {
		t.Errorf("Start failed with %q, want New's error, with the module's log naming the bad strategy", msg)
	}
}
