package filter

import (
	"slices"
	"strconv"

	"github.com/kvroute/kvroute/config"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tidwall/gjson"
)

// modelsPath is OpenAI's model list, which clients (SDKs, UIs) read to
// learn what a server serves.
const modelsPath = "/v1/models"

// answersModels reports whether the router answers GET /v1/models itself
// (config "models.answer"): always with "local", never with
// "passthrough", and with "auto" when some candidate names its model (the
// gateway then knows the list; otherwise an engine does).
func (p *routerPlugin) answersModels() bool {
	switch p.cfg.ModelsAnswer {
	case config.ModelsLocal:
		return true
	case config.ModelsPassthrough:
		return false
	}
	for i := range p.hosts {
		if p.hosts[i].Model != "" {
			return true
		}
	}
	return false
}

// modelsList renders the OpenAI model list of what the candidates (the
// pushed state, else the static endpoints) serve: each base model once, in
// the order the candidates first name it, then each LoRA adapter once with
// its base model as "parent", as vLLM lists them (adapters a host has
// loaded, then the configured loraAdapters whose base is served). created
// is the Unix time in seconds. Its scope is this worker's candidate list,
// which every worker of a gateway builds from the same push.
func (p *routerPlugin) modelsList(created int64) []byte {
	var models, adapters, parents []string
	for i := range p.hosts {
		h := &p.hosts[i]
		if h.Model != "" && !slices.Contains(models, h.Model) {
			models = append(models, h.Model)
		}
		for _, a := range h.Adapters {
			if !slices.Contains(adapters, a) {
				adapters, parents = append(adapters, a), append(parents, h.Model)
			}
		}
	}
	configured := make([]string, 0, len(p.cfg.LoRAAdapters))
	for a := range p.cfg.LoRAAdapters {
		configured = append(configured, a)
	}
	slices.Sort(configured)
	for _, a := range configured {
		if base := p.cfg.LoRAAdapters[a]; slices.Contains(models, base) && !slices.Contains(adapters, a) {
			adapters, parents = append(adapters, a), append(parents, base)
		}
	}
	b := []byte(`{"object":"list","data":[`)
	entry := func(id, parent string) {
		if b[len(b)-1] != '[' {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = gjson.AppendJSONString(b, id)
		b = append(b, `,"object":"model","created":`...)
		b = strconv.AppendInt(b, created, 10)
		b = append(b, `,"owned_by":"kvroute"`...)
		if parent != "" {
			b = append(b, `,"parent":`...)
			b = gjson.AppendJSONString(b, parent)
		}
		b = append(b, '}')
	}
	for _, m := range models {
		entry(m, "")
	}
	for i, a := range adapters {
		if !slices.Contains(models, a) {
			entry(a, parents[i])
		}
	}
	return append(b, "]}"...)
}

// answerModels answers GET /v1/models locally. It is not a routed
// request, and not counted as one.
func (s *routerStream) answerModels() types.Action {
	p := s.plugin
	body := p.modelsList(wallMillis() / 1000)
	if err := proxywasm.SendHttpResponse(200, [][2]string{{"content-type", "application/json"}}, body, -1); err != nil {
		proxywasm.LogWarnf("kvroute.router: sending the model list: %v", err)
		return types.ActionContinue
	}
	return types.ActionPause
}
