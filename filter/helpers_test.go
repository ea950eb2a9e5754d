package filter

import (
	"testing"

	"github.com/kvroute/kvroute/filter/config"
)

// newHostPlugin builds two router plugins from one configuration inside the
// currently running emulator, standing in for two worker VMs.
func newHostPlugin(t *testing.T, cfgJSON string) [2]*routerPlugin {
	t.Helper()
	cfg, err := config.Parse([]byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := newRouter(cfg)
	b, _ := newRouter(cfg)
	return [2]*routerPlugin{a, b}
}
