package main

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// abiExport is a function the host calls, with the signature ABI 0.2.1 gives it.
type abiExport struct {
	name            string
	params, results []api.ValueType
}

func i32s(n int) []api.ValueType {
	t := make([]api.ValueType, n)
	for i := range t {
		t[i] = api.ValueTypeI32
	}
	return t
}

// requiredExports are the functions Envoy calls on an HTTP filter module.
// Missing any of them makes Envoy refuse the module or fail a stream.
var requiredExports = []abiExport{
	{"_initialize", nil, nil},
	{"proxy_abi_version_0_2_1", nil, nil},
	{"proxy_on_memory_allocate", i32s(1), i32s(1)},
	{"proxy_on_context_create", i32s(2), nil},
	{"proxy_on_vm_start", i32s(2), i32s(1)},
	{"proxy_on_configure", i32s(2), i32s(1)},
	{"proxy_on_request_headers", i32s(3), i32s(1)},
	{"proxy_on_request_body", i32s(3), i32s(1)},
	{"proxy_on_response_headers", i32s(3), i32s(1)},
	{"proxy_on_response_body", i32s(3), i32s(1)},
	{"proxy_on_http_call_response", i32s(5), nil},
	{"proxy_on_tick", i32s(1), nil},
	{"proxy_on_done", i32s(1), i32s(1)},
	{"proxy_on_log", i32s(1), nil},
	{"proxy_on_delete", i32s(1), nil},
}

// Import modules a proxy-wasm host provides.
const (
	hostModule = "env" // functions named proxy_*
	wasiModule = "wasi_snapshot_preview1"
)

type checkReport struct {
	exports int
	imports []string // module.name, sorted
}

// importSummary counts imports per module, for the one-line build summary.
func (r checkReport) importSummary() []string {
	counts := map[string]int{}
	for _, imp := range r.imports {
		counts[imp[:strings.IndexByte(imp, '.')]]++
	}
	var out []string
	for m, n := range counts {
		out = append(out, fmt.Sprintf("%d from %s", n, m))
	}
	sort.Strings(out)
	return out
}

// checkModule compiles wasm with wazero (without instantiating it) and checks
// its exports and imports against what a proxy-wasm host requires. The error
// lists every problem, one per line, with what to do about it.
func checkModule(ctx context.Context, wasm []byte) (checkReport, error) {
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	mod, err := r.CompileModule(ctx, wasm)
	if err != nil {
		return checkReport{}, fmt.Errorf("wazero cannot compile it: %w", err)
	}
	defer mod.Close(ctx)

	var problems []string
	exports := mod.ExportedFunctions()
	for _, want := range requiredExports {
		def, ok := exports[want.name]
		if !ok {
			problems = append(problems, fmt.Sprintf("missing export %s (build with -buildmode=c-shared and the ABI bridge overlay; register root contexts in init())", want.name))
			continue
		}
		if !sameTypes(def.ParamTypes(), want.params) || !sameTypes(def.ResultTypes(), want.results) {
			problems = append(problems, fmt.Sprintf("export %s has signature %s, ABI 0.2.1 wants %s (fix internal/deploy/wasmbuild/abibridge/callbacks.go.in)",
				want.name, signature(def.ParamTypes(), def.ResultTypes()), signature(want.params, want.results)))
		}
	}
	if _, ok := mod.ExportedMemories()["memory"]; !ok {
		problems = append(problems, "missing export memory (the host reads and writes buffers through it)")
	}
	if mems := mod.ImportedMemories(); len(mems) > 0 {
		problems = append(problems, "the module imports its memory; a proxy-wasm module must define and export it")
	}

	var report checkReport
	report.exports = len(exports)
	for _, def := range mod.ImportedFunctions() {
		module, name, _ := def.Import()
		report.imports = append(report.imports, module+"."+name)
		switch {
		case module == hostModule && strings.HasPrefix(name, "proxy_"):
		case module == wasiModule:
		default:
			problems = append(problems, fmt.Sprintf("import %s.%s is neither env.proxy_* nor %s: Envoy will refuse to load the module (a dependency uses a host function; remove it from the Wasm build)", module, name, wasiModule))
		}
	}
	sort.Strings(report.imports)
	if len(problems) > 0 {
		return report, fmt.Errorf("\n  %s", strings.Join(problems, "\n  "))
	}
	return report, nil
}

func sameTypes(a, b []api.ValueType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func signature(params, results []api.ValueType) string {
	name := func(ts []api.ValueType) string {
		s := make([]string, len(ts))
		for i, t := range ts {
			s[i] = api.ValueTypeName(t)
		}
		return "(" + strings.Join(s, ",") + ")"
	}
	return name(params) + "->" + name(results)
}
