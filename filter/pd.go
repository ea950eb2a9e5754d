package filter

import (
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/filter/config"
)

// pdPlugin is the kvroute.pd root: prefill on one pod, then decode on
// another. Until that filter lands it passes every stream through, behind the
// same panic guard as the router.
type pdPlugin struct {
	cfg   *config.Config
	stats commonStats
}

func newPD(cfg *config.Config) (*pdPlugin, error) {
	return &pdPlugin{cfg: cfg, stats: newCommonStats("pd")}, nil
}

func (p *pdPlugin) newStream(uint32) types.HttpContext { return &pdStream{plugin: p} }

func (p *pdPlugin) onTick() {}

type pdStream struct {
	types.DefaultHttpContext
	plugin *pdPlugin
}

func (s *pdStream) OnHttpRequestHeaders(int, bool) (action types.Action) {
	defer guard(s.plugin.stats.recoveredPanics, "kvroute.pd on_request_headers", &action, nil)
	return types.ActionContinue
}
