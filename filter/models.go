package filter

import (
	"slices"
	"strconv"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/openai"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tidwall/gjson"
)

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

// servedModels is what the candidates (the pushed state, else the static
// endpoints) serve: each base model once, in the order the candidates
// first name it, then each LoRA adapter once with its base model as
// parent, as vLLM lists them (adapters a host has loaded, then the
// configured loraAdapters whose base is served; an adapter named like a
// base model is the model). Its scope is this worker's candidate list,
// which every worker of a gateway builds from the same push.
func (p *routerPlugin) servedModels() (models, adapters, parents []string) {
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
	n := 0
	for i, a := range adapters {
		if !slices.Contains(models, a) {
			adapters[n], parents[n] = a, parents[i]
			n++
		}
	}
	return models, adapters[:n], parents[:n]
}

// modelsList renders the OpenAI model list of servedModels. created is
// the Unix time in seconds.
func (p *routerPlugin) modelsList(created int64) []byte {
	models, adapters, parents := p.servedModels()
	b := []byte(`{"object":"list","data":[`)
	for i, m := range models {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendModel(b, m, "", created)
	}
	for i, a := range adapters {
		if i > 0 || len(models) > 0 {
			b = append(b, ',')
		}
		b = appendModel(b, a, parents[i], created)
	}
	return append(b, "]}"...)
}

// modelObject renders OpenAI's model object of id (GET /v1/models/{id}),
// nil when the candidates serve no model or adapter of that id.
func (p *routerPlugin) modelObject(id string, created int64) []byte {
	models, adapters, parents := p.servedModels()
	if slices.Contains(models, id) {
		return appendModel(nil, id, "", created)
	}
	if i := slices.Index(adapters, id); i >= 0 {
		return appendModel(nil, id, parents[i], created)
	}
	return nil
}

// appendModel appends one model object: id, "object":"model", created,
// owned_by, and a LoRA adapter's base model as parent.
func appendModel(b []byte, id, parent string, created int64) []byte {
	b = append(b, `{"id":`...)
	b = gjson.AppendJSONString(b, id)
	b = append(b, `,"object":"model","created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"owned_by":"kvroute"`...)
	if parent != "" {
		b = append(b, `,"parent":`...)
		b = gjson.AppendJSONString(b, parent)
	}
	return append(b, '}')
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

// answerModel answers GET /v1/models/{id} locally: the model object, or,
// for an id the candidates do not serve, OpenAI's 404 model_not_found
// (counted in requests.model_not_found). Not a routed request.
func (s *routerStream) answerModel(id string) types.Action {
	p := s.plugin
	body := p.modelObject(id, wallMillis()/1000)
	if body == nil {
		p.stats.notFound.Increment(1)
		p.stats.modelNotFound.Increment(1)
		return s.reject(modelNotFound(id))
	}
	if err := proxywasm.SendHttpResponse(200, [][2]string{{"content-type", "application/json"}}, body, -1); err != nil {
		proxywasm.LogWarnf("kvroute.router: sending a model object: %v", err)
		return types.ActionContinue
	}
	return types.ActionPause
}

// modelNotFound is OpenAI's answer to a model it does not serve.
func modelNotFound(model string) *openai.Error {
	return &openai.Error{Status: 404, Param: "model", Code: "model_not_found",
		Message: "The model '" + model + "' does not exist."}
}
