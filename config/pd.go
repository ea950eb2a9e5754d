package config

import (
	"github.com/tidwall/gjson"
)

// The "pd" object configures the kvroute.pd filter (prefill on one pod, then
// decode on another). The decision to disaggregate is not here: it is the
// router's, under "disaggregation" (package scorer: prefillStrategy and
// threshold, the estimated uncached prompt tokens from which a request is
// split, default 512). kvroute.pd acts on the prefill host the router
// publishes and on nothing else.

// Protocols kvroute.pd speaks.
const (
	// PDProtocolVLLM is vLLM's NixlConnector: prefill first (max_tokens 1,
	// kv_transfer_params do_remote_decode), then decode with the
	// kv_transfer_params the prefill response returned.
	PDProtocolVLLM = "vllm"
	// PDProtocolSGLang is SGLang's bootstrap pairing: the same body, with
	// bootstrap_host, bootstrap_port and bootstrap_room, goes to the prefill
	// and the decode server at once.
	PDProtocolSGLang = "sglang"
)

// PD defaults.
const (
	DefaultPDProtocol       = PDProtocolVLLM
	DefaultPDPrefillCluster = "kvroute_prefill"
	DefaultPDDecodeCluster  = "kvroute_inference"
	DefaultPDTimeoutMs      = 30_000
	// DefaultPDBootstrapPort is SGLang's --disaggregation-bootstrap-port
	// default.
	DefaultPDBootstrapPort = 8998
	DefaultPDMarkerHeader  = "x-kvroute-pd"
	// DefaultPDFallbackTimeoutMs bounds the decode-only request SGLang's
	// late fallback sends as a callout (a whole generation, buffered).
	DefaultPDFallbackTimeoutMs = 300_000
)

// PD is the kvroute.pd configuration.
type PD struct {
	// Protocol is PDProtocolVLLM or PDProtocolSGLang.
	Protocol string
	// PrefillCluster is the Envoy cluster the prefill request is dispatched
	// to (dispatch_http_call). The destination header of that callout names
	// the prefill host, so the cluster needs the override_host policy (or
	// ORIGINAL_DST) like the route's cluster.
	PrefillCluster string
	// DecodeCluster is the route's cluster, used only by SGLang's late
	// fallback (the decode-only request is then a callout).
	DecodeCluster string
	// TimeoutMs bounds the prefill request. A timeout falls back to
	// decode-only.
	TimeoutMs int
	// FallbackTimeoutMs bounds SGLang's decode-only fallback callout.
	FallbackTimeoutMs int
	// BootstrapPort is the SGLang prefill servers' bootstrap port; 0 means
	// the prefill endpoint's own port (the simulator's convention).
	BootstrapPort int
	// MarkerHeader is the response header that says what happened:
	// "prefill=remote" (vLLM), "prefill=bootstrap" (SGLang) or
	// "fallback=<reason>" (decode-only). Empty disables it.
	MarkerHeader string
}

func defaultPD() PD {
	return PD{
		Protocol:          DefaultPDProtocol,
		PrefillCluster:    DefaultPDPrefillCluster,
		DecodeCluster:     DefaultPDDecodeCluster,
		TimeoutMs:         DefaultPDTimeoutMs,
		FallbackTimeoutMs: DefaultPDFallbackTimeoutMs,
		BootstrapPort:     DefaultPDBootstrapPort,
		MarkerHeader:      DefaultPDMarkerHeader,
	}
}

// pd parses the "pd" object over the defaults.
func (p *parser) pd(v gjson.Result, path string) PD {
	d := defaultPD()
	if !v.IsObject() {
		p.fail(path, "must be an object like {\"protocol\": \"vllm\", \"prefillCluster\": %q}, got %s", DefaultPDPrefillCluster, kind(v))
		return d
	}
	p.object(v, path, map[string]func(gjson.Result, string){
		"protocol": func(v gjson.Result, fp string) {
			s, ok := p.str(v, fp)
			if !ok {
				return
			}
			switch s {
			case PDProtocolVLLM, PDProtocolSGLang:
				d.Protocol = s
			default:
				p.fail(fp, "%q is not a protocol: use %q (NixlConnector) or %q (bootstrap)", s, PDProtocolVLLM, PDProtocolSGLang)
			}
		},
		"prefillCluster":    func(v gjson.Result, fp string) { d.PrefillCluster = p.nonEmptyString(v, fp) },
		"decodeCluster":     func(v gjson.Result, fp string) { d.DecodeCluster = p.nonEmptyString(v, fp) },
		"timeoutMs":         func(v gjson.Result, fp string) { d.TimeoutMs = p.intRange(v, fp, 1, 3600*1000) },
		"fallbackTimeoutMs": func(v gjson.Result, fp string) { d.FallbackTimeoutMs = p.intRange(v, fp, 1, 3600*1000) },
		"bootstrapPort":     func(v gjson.Result, fp string) { d.BootstrapPort = p.intRange(v, fp, 0, 65535) },
		"markerHeader":      func(v gjson.Result, fp string) { d.MarkerHeader = p.optionalHeaderName(v, fp) },
		"threshold": func(v gjson.Result, fp string) {
			p.fail(fp, "the disaggregation threshold is the router's decision: set \"disaggregation\": {\"threshold\": N} at the top level")
		},
	})
	return d
}
