// Package openai reads OpenAI-style inference requests (completions, chat
// completions, embeddings) for the router: it validates a body, hashes its
// prompt into prefix blocks and returns the few fields routing needs, and it
// rewrites bodies (removing client-set prefill/decode fields, the prefill and
// decode bodies of kvroute.pd) without unmarshalling them. On the way back it
// reads the usage an engine reports in a response (cached_tokens,
// prompt_tokens), chunk by chunk (usage.go). It reads request paths as the
// engines' HTTP servers do (path.go), so that another spelling of a path the
// gateway answers itself is that path.
//
// It exists apart from filter so that the request parsing, and the JSON
// scanner under it, are one concern that imports no proxy-wasm SDK: its unit
// tests, fuzz targets and benchmarks run natively, while it is compiled into
// the Wasm module through filter, where its cost per byte of body is most of
// a request's (docs/performance.md).
package openai
