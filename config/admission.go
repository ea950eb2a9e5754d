package config

import (
	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/admission"
)

// The "admission" object turns on holding requests in the router when every
// eligible engine is saturated (package admission has the model).
// Present means enabled unless "enabled": false. Example:
//
//	"admission": {
//	  "maxHeld": 256, "tickMs": 10, "retryAfterS": 1,
//	  "defaultClass": "standard",
//	  "pathClasses":  {"/v1/embeddings": "batch"},
//	  "modelClasses": {"llama-batch": "batch"},
//	  "deadlineMs":   {"interactive": 10000, "standard": 30000, "batch": 240000},
//	  "maxWaiting": 4, "maxKvUsage": 0.95, "maxPendingPrefillTokens": 16384,
//	  "priorityHeader": "x-kvroute-priority", "deadlineHeader": "x-kvroute-deadline-ms"
//	}
//
// priorityHeader and deadlineHeader are off by default: a client's own
// x-kvroute-priority is stripped unread. Name one only when Envoy sets it
// (or removes the client's) before kvroute runs.

// admissionCfg parses the "admission" object over admission.Defaults.
func (p *parser) admissionCfg(v gjson.Result, path string) admission.Config {
	c := admission.Defaults()
	if !v.IsObject() {
		p.fail(path, "must be an object like {\"maxHeld\": %d, \"maxPendingPrefillTokens\": %d}, got %s", admission.DefaultMaxHeld, admission.DefaultMaxPending, kind(v))
		return c
	}
	c.Enabled = true
	class := func(v gjson.Result, fp string) (admission.Class, bool) {
		s := v.Raw
		if v.Type == gjson.String {
			s = v.Str
		}
		cl, err := admission.ParseClass(s)
		if err != nil {
			p.fail(fp, "%v", err)
			return 0, false
		}
		return cl, true
	}
	classMap := func(v gjson.Result, fp string) map[string]admission.Class {
		if !v.IsObject() {
			p.fail(fp, "must be an object of classes, got %s", kind(v))
			return nil
		}
		m := map[string]admission.Class{}
		v.ForEach(func(k, val gjson.Result) bool {
			if cl, ok := class(val, join(fp, k.String())); ok {
				m[k.String()] = cl
			}
			return true
		})
		return m
	}
	p.object(v, path, map[string]func(gjson.Result, string){
		"enabled":     func(v gjson.Result, fp string) { c.Enabled = p.boolean(v, fp) },
		"tickMs":      func(v gjson.Result, fp string) { c.TickMs = p.intRange(v, fp, 1, 1000) },
		"maxHeld":     func(v gjson.Result, fp string) { c.MaxHeld = p.intRange(v, fp, 0, 1<<16) },
		"retryAfterS": func(v gjson.Result, fp string) { c.RetryAfterS = p.intRange(v, fp, 0, 3600) },
		"defaultClass": func(v gjson.Result, fp string) {
			if cl, ok := class(v, fp); ok {
				c.DefaultClass = cl
			}
		},
		"pathClasses":  func(v gjson.Result, fp string) { c.PathClasses = classMap(v, fp) },
		"modelClasses": func(v gjson.Result, fp string) { c.ModelClasses = classMap(v, fp) },
		"deadlineMs": func(v gjson.Result, fp string) {
			if !v.IsObject() {
				p.fail(fp, "must be an object like {\"interactive\": %d}, got %s", admission.DefaultInteractiveD, kind(v))
				return
			}
			fields := map[string]func(gjson.Result, string){}
			for i, band := range admission.Bands {
				fields[band] = func(v gjson.Result, fp string) { c.DeadlineMs[i] = p.intRange(v, fp, 1, admission.MaxDeadlineMs) }
			}
			p.object(v, fp, fields)
		},
		"priorityHeader": func(v gjson.Result, fp string) { c.PriorityHeader = p.optionalHeaderName(v, fp) },
		"deadlineHeader": func(v gjson.Result, fp string) { c.DeadlineHeader = p.optionalHeaderName(v, fp) },
		"maxWaiting":     func(v gjson.Result, fp string) { c.Thresholds.MaxWaiting = p.intRange(v, fp, 0, 1<<20) },
		"maxKvUsage": func(v gjson.Result, fp string) {
			if v.Type != gjson.Number || v.Float() < 0 || v.Float() > 1 {
				p.fail(fp, "must be a number from 0 (off) to 1, got %s", v.Raw)
				return
			}
			c.Thresholds.MaxKVUsage = v.Float()
		},
		"maxPendingPrefillTokens": func(v gjson.Result, fp string) {
			c.Thresholds.MaxPendingPrefillTokens = int64(p.intRange(v, fp, 0, 1<<30))
		},
	})
	if c.Enabled {
		if err := c.Validate(); err != nil {
			p.fail(path, "%v", err)
		}
	}
	return c
}
