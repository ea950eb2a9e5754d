package main

import (
	"github.com/kvroute/kvroute/internal/buildinfo"

	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// ---- a tiny Wasm encoder, to give checkModule modules with known faults ----

type wfunc struct {
	module, name    string // import (module set) or export (module empty)
	params, results int    // counts of i32
}

func uleb(n int) []byte {
	var b []byte
	for {
		c := byte(n & 0x7f)
		n >>= 7
		if n != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

func wname(s string) []byte { return append(uleb(len(s)), s...) }

func section(id byte, items ...[]byte) []byte {
	body := uleb(len(items))
	for _, it := range items {
		body = append(body, it...)
	}
	return append(append([]byte{id}, uleb(len(body))...), body...)
}

// buildWasm encodes a module importing and exporting the given functions
// (each export returns zeros), with an exported memory if memory is true.
func buildWasm(imports, exports []wfunc, memory bool) []byte {
	var types, imps, funcs, exps, codes [][]byte
	typeOf := func(f wfunc) []byte {
		t := []byte{0x60}
		t = append(t, uleb(f.params)...)
		t = append(t, bytes.Repeat([]byte{0x7f}, f.params)...)
		t = append(t, uleb(f.results)...)
		t = append(t, bytes.Repeat([]byte{0x7f}, f.results)...)
		types = append(types, t)
		return uleb(len(types) - 1)
	}
	for _, f := range imports {
		imps = append(imps, append(append(append(wname(f.module), wname(f.name)...), 0x00), typeOf(f)...))
	}
	for i, f := range exports {
		funcs = append(funcs, typeOf(f))
		exps = append(exps, append(append(wname(f.name), 0x00), uleb(len(imports)+i)...))
		body := []byte{0x00} // no locals
		for r := 0; r < f.results; r++ {
			body = append(body, 0x41, 0x00) // i32.const 0
		}
		body = append(body, 0x0b)
		codes = append(codes, append(uleb(len(body)), body...))
	}
	out := []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}
	out = append(out, section(1, types...)...)
	out = append(out, section(2, imps...)...)
	out = append(out, section(3, funcs...)...)
	if memory {
		out = append(out, section(5, []byte{0x00, 0x01})...)
		exps = append(exps, append(wname("memory"), 0x02, 0x00))
	}
	out = append(out, section(7, exps...)...)
	out = append(out, section(10, codes...)...)
	return out
}

func goodExports() []wfunc {
	var fs []wfunc
	for _, e := range requiredExports {
		fs = append(fs, wfunc{name: e.name, params: len(e.params), results: len(e.results)})
	}
	return fs
}

func TestCheckModule(t *testing.T) {
	ctx := context.Background()
	okImports := []wfunc{{module: "env", name: "proxy_log", params: 3, results: 1}, {module: "wasi_snapshot_preview1", name: "fd_write", params: 4, results: 1}}

	report, err := checkModule(ctx, buildWasm(okImports, goodExports(), true))
	if err != nil {
		t.Fatalf("a complete module was refused: %v", err)
	}
	if report.exports != len(requiredExports) || len(report.imports) != 2 {
		t.Errorf("report = %+v", report)
	}

	var missing []wfunc
	for _, f := range goodExports() {
		if f.name != "proxy_on_request_body" && f.name != "_initialize" {
			missing = append(missing, f)
		}
	}
	_, err = checkModule(ctx, buildWasm(okImports, missing, true))
	for _, want := range []string{"missing export proxy_on_request_body", "missing export _initialize", "-buildmode=c-shared"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("missing exports: error %v, want it to mention %q", err, want)
		}
	}

	badSig := goodExports()
	for i := range badSig {
		if badSig[i].name == "proxy_on_request_headers" {
			badSig[i].params = 2
		}
	}
	_, err = checkModule(ctx, buildWasm(okImports, badSig, true))
	if err == nil || !strings.Contains(err.Error(), "export proxy_on_request_headers has signature (i32,i32)->(i32), ABI 0.2.1 wants (i32,i32,i32)->(i32)") {
		t.Errorf("bad signature: error %v", err)
	}

	_, err = checkModule(ctx, buildWasm(okImports, goodExports(), false))
	if err == nil || !strings.Contains(err.Error(), "missing export memory") {
		t.Errorf("no memory: error %v", err)
	}

	badImports := append(okImports, wfunc{module: "env", name: "abort", params: 0}, wfunc{module: "gojs", name: "runtime.ticks", params: 1})
	_, err = checkModule(ctx, buildWasm(badImports, goodExports(), true))
	for _, want := range []string{"import env.abort is neither", "import gojs.runtime.ticks is neither"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad imports: error %v, want %q", err, want)
		}
	}

	if _, err := checkModule(ctx, []byte("not wasm")); err == nil || !strings.Contains(err.Error(), "wazero cannot compile it") {
		t.Errorf("garbage: error %v", err)
	}
}

func TestParseEnvoyCompat(t *testing.T) {
	for _, ok := range []string{"1.33", "v1.35", "1.38.2"} {
		c, err := parseEnvoyCompat(ok)
		if err != nil || !c.enabled {
			t.Errorf("%s: %+v %v", ok, c, err)
		}
	}
	if c, err := parseEnvoyCompat(""); err != nil || c.enabled {
		t.Errorf("empty: %+v %v", c, err)
	}
	for in, want := range map[string]string{"1.39": "implement poll_oneoff", "1.40": "implement poll_oneoff", "1.32": "cannot load modules", "2.0": "such as 1.33", "x": "such as 1.33"} {
		if _, err := parseEnvoyCompat(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", in, err, want)
		}
	}
}

// The patch anchors must match this toolchain's runtime exactly once each, and
// the patched files must no longer throw on a failed poll_oneoff.
func TestRuntimePatchMatchesThisToolchain(t *testing.T) {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range runtimePatches {
		src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "src", "runtime", p.file))
		if err != nil {
			t.Fatal(err)
		}
		patched, err := applyPatch(p.file, src, p.edits)
		if err != nil {
			t.Fatalf("this Go release no longer matches the compat patch: %v", err)
		}
		for _, e := range p.edits {
			if bytes.Contains(patched, []byte(e.old)) || !bytes.Contains(patched, []byte(e.new)) {
				t.Errorf("%s: edit not applied", p.file)
			}
		}
	}
	if _, err := applyPatch("x.go", []byte("nothing here"), runtimePatches[0].edits); err == nil || !strings.Contains(err.Error(), "update internal/deploy/wasmbuild/compat.go") {
		t.Errorf("missing anchor: error %v", err)
	}
}

// TestEnvoyCompatSurvivesFailingPollOneoff builds both variants of the
// gcprobe module (the filter plus an armed timer, which starts the netpoller
// as a sleeping runtime goroutine eventually does after hours of traffic) and
// runs each in wazero with a poll_oneoff that fails the way Envoy < 1.39 does
// (ENOTSUP), then runs the GC. The standard build must die with "poll_oneoff failed" (the bug is real
// and this test can see it); the compat build must keep running.
func TestEnvoyCompatSurvivesFailingPollOneoff(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the module twice")
	}
	dir := t.TempDir()
	ctx := context.Background()
	standard := filepath.Join(dir, "standard.wasm")
	compat := filepath.Join(dir, "compat.wasm")
	if err := run(ctx, options{out: standard, pkg: gcProbePackage}); err != nil {
		t.Fatal(err)
	}
	if err := run(ctx, options{out: compat, pkg: gcProbePackage, envoyCompat: "1.33"}); err != nil {
		t.Fatal(err)
	}

	for path, want := range map[string]string{standard: buildinfo.VariantStandard, compat: buildinfo.VariantEnvoyCompat} {
		data, _ := os.ReadFile(path)
		info, err := buildinfo.FromWasm(data)
		if err != nil || info.Variant != want || info.Version != buildinfo.Release || info.Go == "" {
			t.Errorf("%s records %+v (%v), want the %s variant of %s", filepath.Base(path), info, err, want, buildinfo.Release)
		}
	}

	died, stderr := gcUnderFailingPoll(t, standard)
	if !died || !strings.Contains(stderr, "poll_oneoff failed") {
		t.Errorf("standard build under a failing poll_oneoff: died=%v stderr=%q; expected the golang/go#78513 crash", died, stderr)
	}
	died, stderr = gcUnderFailingPoll(t, compat)
	if died {
		t.Errorf("compat build died under a failing poll_oneoff: %s", stderr)
	}
}

const (
	errnoNotSup    = 58
	gcProbePackage = "./internal/deploy/wasmbuild/testdata/gcprobe"
)

func gcUnderFailingPoll(t *testing.T, path string) (died bool, stderr string) {
	t.Helper()
	ctx := context.Background()
	wasm, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	wasi := r.NewHostModuleBuilder(wasi_snapshot_preview1.ModuleName)
	wasi_snapshot_preview1.NewFunctionExporter().ExportFunctions(wasi)
	wasi.NewFunctionBuilder().WithGoFunction(api.GoFunc(func(_ context.Context, stack []uint64) {
		stack[0] = errnoNotSup
	}), []api.ValueType{api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}).Export("poll_oneoff")
	if _, err := wasi.Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	compiled, err := r.CompileModule(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	env := r.NewHostModuleBuilder("env")
	for _, def := range compiled.ImportedFunctions() {
		if mod, name, _ := def.Import(); mod == "env" {
			n := len(def.ResultTypes())
			env.NewFunctionBuilder().WithGoFunction(api.GoFunc(func(_ context.Context, stack []uint64) {
				for i := 0; i < n; i++ {
					stack[i] = 0
				}
			}), def.ParamTypes(), def.ResultTypes()).Export(name)
		}
	}
	if _, err := env.Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	var errBuf bytes.Buffer
	mod, err := r.InstantiateModule(ctx, compiled, wazero.NewModuleConfig().WithStderr(&errBuf).WithStartFunctions("_initialize"))
	if err != nil {
		t.Fatalf("instantiate: %v", err)
	}
	gc := mod.ExportedFunction("kvroute_probe_gc")
	for i := 0; i < 3; i++ {
		if _, err := gc.Call(ctx); err != nil {
			return true, errBuf.String()
		}
	}
	return false, errBuf.String()
}
