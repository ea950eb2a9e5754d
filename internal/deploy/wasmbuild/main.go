// Command wasmbuild builds dist/kvroute.wasm with the official Go toolchain.
//
// The filters are written against github.com/tetratelabs/proxy-wasm-go-sdk
// v0.24.0, which targets TinyGo. To build them with `GOOS=wasip1 GOARCH=wasm
// go build -buildmode=c-shared`, wasmbuild
//
//  1. copies the SDK, unmodified, from the module cache into .wasmbuild/sdk
//     (git-ignored; Go refuses overlays of files inside GOMODCACHE),
//  2. writes a build-only .wasmbuild/go.work whose replace points the SDK at
//     that copy (the repository's go.mod is never touched),
//  3. writes an overlay that injects the project's ABI bridge
//     (internal/deploy/wasmbuild/abibridge) into the copy's internal package, and, with
//     -envoy-compat, a patched copy of the Go runtime's poll_oneoff callers,
//  4. builds the Wasm main package and checks the result with wazero: every
//     export Envoy calls must be present with the ABI's signature, and every
//     import must come from env.proxy_* or wasi_snapshot_preview1.
//
// A Go build without the bridge or without c-shared succeeds and exports
// nothing Envoy can call, which is why step 4 exists.
//
// Usage (what `make wasm` runs):
//
//	go run ./internal/deploy/wasmbuild [-envoy-compat 1.35] [-out FILE]
//
// Each variant has its own default file (dist/kvroute.wasm,
// dist/kvroute-envoy-compat.wasm), so building one never replaces the other,
// and the module records its version, revision, Go version and variant in a
// kvroute.buildinfo custom section (`kvroute version FILE.wasm` reads it).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvroute/kvroute/internal/buildinfo"
)

// mainPackage is the Wasm main package: it registers the root contexts in init().
const mainPackage = "./filter/module"

func main() {
	var (
		out         = flag.String("out", "", "where to write the module (default: dist/kvroute.wasm, or dist/kvroute-envoy-compat.wasm with -envoy-compat)")
		envoyCompat = flag.String("envoy-compat", "", "build the envoy-compat variant for an older Envoy `version` (1.33 to 1.38): tolerate poll_oneoff failures in Go's runtime (golang/go#78513)")
		pkg         = flag.String("pkg", mainPackage, "Wasm main package to build")
		verbose     = flag.Bool("v", false, "print the go build command and the module's imports")
	)
	flag.Parse()
	if err := run(context.Background(), options{out: *out, envoyCompat: *envoyCompat, pkg: *pkg, verbose: *verbose}); err != nil {
		fmt.Fprintln(os.Stderr, "wasmbuild:", err)
		os.Exit(1)
	}
}

type options struct {
	out         string
	envoyCompat string
	pkg         string
	verbose     bool
}

func run(ctx context.Context, opt options) error {
	compat, err := parseEnvoyCompat(opt.envoyCompat)
	if err != nil {
		return err
	}
	root, err := repoRoot(ctx)
	if err != nil {
		return err
	}
	work := filepath.Join(root, ".wasmbuild")
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	sdkDir, err := copySDK(ctx, root, work)
	if err != nil {
		return err
	}
	prettyReplace, err := writePrettyPatch(ctx, root, work)
	if err != nil {
		return err
	}
	goWork, err := writeGoWork(work, sdkDir, prettyReplace)
	if err != nil {
		return err
	}
	overlay, err := writeOverlay(ctx, work, sdkDir, compat)
	if err != nil {
		return err
	}
	variant := compat.variant()
	out, err := outputPath(opt.out, variant)
	if err != nil {
		return err
	}
	if !filepath.IsAbs(out) {
		out = filepath.Join(root, out)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.tmp-%d", out, os.Getpid())
	defer os.Remove(tmp)
	info := buildinfo.Source(ctx, root)
	info.Variant = variant.Name
	if err := goBuild(ctx, root, goWork, overlay, opt.pkg, tmp, info.String()+", "+variant.Describe(), opt.verbose); err != nil {
		return err
	}
	wasm, err := os.ReadFile(tmp)
	if err != nil {
		return err
	}
	report, err := checkModule(ctx, wasm)
	if err != nil {
		return fmt.Errorf("%s was built but is not a loadable proxy-wasm module: %w", rel(root, out), err)
	}
	if wasm, err = buildinfo.AppendToWasm(wasm, info); err != nil {
		return err
	}
	if err := os.WriteFile(tmp, wasm, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	fmt.Printf("wasmbuild: wrote %s (%.1f MB, kvroute %s, %s): %d exports, imports %s\n",
		rel(root, out), float64(len(wasm))/1e6, info, variant.Describe(), report.exports, strings.Join(report.importSummary(), ", "))
	if opt.verbose {
		for _, imp := range report.imports {
			fmt.Println("  import", imp)
		}
	}
	return nil
}

// outputPath is where the module goes: out when given, else the variant's
// own file under dist/. A path named after the other variant's file is
// refused: it is how a compat build would silently replace the standard one.
func outputPath(out string, v buildinfo.Variant) (string, error) {
	if out == "" {
		return filepath.Join("dist", v.WasmFile), nil
	}
	for _, other := range buildinfo.Variants {
		if other.Name != v.Name && filepath.Base(out) == other.WasmFile {
			return "", fmt.Errorf("-out %s is the %s module's file name; the %s build goes to %s (or a name of your own)", out, other.Name, v.Name, v.WasmFile)
		}
	}
	return out, nil
}

func rel(root, path string) string {
	if r, err := filepath.Rel(root, path); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return path
}
