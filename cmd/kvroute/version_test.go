package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/buildinfo"
	"github.com/kvroute/kvroute/internal/deploy/oci"
)

// recordedWasm writes a synthetic module carrying a build record.
func recordedWasm(t *testing.T, info buildinfo.Info) string {
	t.Helper()
	_, header := syntheticWasm(t, 9, 0)
	// One custom section "x" of three bytes stands for the module's code.
	module, err := buildinfo.AppendToWasm(append(header, 0, 5, 1, 'x', 1, 2, 3), info)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "m.wasm")
	if err := os.WriteFile(path, module, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestVersionOfTheBinary(t *testing.T) {
	out, err := runCLI(t, "version")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kvroute " + buildinfo.Release, runtime.Version(), "module   " + buildinfo.ModulePath, runtime.GOOS + "/" + runtime.GOARCH} {
		if !strings.Contains(out, want) {
			t.Errorf("kvroute version lacks %q:\n%s", want, out)
		}
	}
}

func TestVersionOfModulesAndArchives(t *testing.T) {
	compat := buildinfo.Info{Version: "v0.1.0", Revision: "0123456789abcdef0123", Go: "go1.26.8", Variant: buildinfo.VariantEnvoyCompat}
	wasm := recordedWasm(t, compat)
	archive := filepath.Join(t.TempDir(), "x-oci.tar")
	if _, err := runCLI(t, "oci", "build", "--wasm", wasm, "--out", archive); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, "version", wasm, archive)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{wasm, archive} {
		want := f + ": kvroute v0.1.0 (revision 0123456789ab, go1.26.8), envoy-compat build, for Envoy 1.33 to 1.38"
		if !strings.Contains(out, want) {
			t.Errorf("version output lacks %q:\n%s", want, out)
		}
	}
	js, err := runCLI(t, "version", "--json", wasm)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(js), &got); err != nil || got["variant"] != "envoy-compat" || got["envoy"] != "Envoy 1.33 to 1.38" {
		t.Errorf("--json: %v %s", err, js)
	}

	// A module without a record, and a file that is neither: errors naming the file.
	bare, _ := syntheticWasm(t, 2, 0) // the header alone: a valid, empty module
	if _, err := runCLI(t, "version", bare); err == nil || !strings.Contains(err.Error(), bare) || !strings.Contains(err.Error(), "no kvroute build information") {
		t.Errorf("module without a record: %v", err)
	}
	notes := filepath.Join(t.TempDir(), "notes.txt")
	os.WriteFile(notes, []byte("hello"), 0o644)
	if _, err := runCLI(t, "version", notes); err == nil || !strings.Contains(err.Error(), notes) {
		t.Errorf("not a module: %v", err)
	}
}

// TestOCIBuildKeepsTheVariantsApart: the archive name and tag follow the
// module's variant, the manifest says which it is, and an envoy-compat
// module is refused under the standard archive's name (and the reverse).
func TestOCIBuildKeepsTheVariantsApart(t *testing.T) {
	compat := recordedWasm(t, buildinfo.Info{Version: "v0.1.0", Revision: "abc", Go: "go1.26.8", Variant: buildinfo.VariantEnvoyCompat})
	standard := recordedWasm(t, buildinfo.Info{Version: "v0.1.0", Revision: "abc", Go: "go1.26.8", Variant: buildinfo.VariantStandard})

	dir := t.TempDir()
	t.Chdir(dir) // the default --out is under dist/ of the working directory
	if _, err := runCLI(t, "oci", "build", "--wasm", compat); err != nil {
		t.Fatal(err)
	}
	if _, err := runCLI(t, "oci", "build", "--wasm", standard); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]struct{ variant, ref string }{
		"dist/kvroute-envoy-compat-oci.tar": {"envoy-compat", "kvroute:v0.1.0-envoy-compat"},
		"dist/kvroute-oci.tar":              {"standard", "kvroute:v0.1.0"},
	} {
		img, err := oci.ReadArchive(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		m, _ := img.Manifest()
		if m.Annotations[oci.EnvoyVariantAnnotation] != want.variant || m.Annotations[oci.VersionAnnotation] != "v0.1.0" || m.Annotations[oci.RevisionAnnotation] != "abc" {
			t.Errorf("%s: annotations %v", path, m.Annotations)
		}
		index, _ := os.ReadFile(filepath.Join(dir, path))
		if !strings.Contains(string(index), `"`+oci.RefNameAnnotation+`": "`+want.ref+`"`) {
			t.Errorf("%s is not tagged %s", path, want.ref)
		}
	}
	if _, err := runCLI(t, "oci", "build", "--wasm", compat, "--out", "dist/kvroute-oci.tar"); err == nil || !strings.Contains(err.Error(), "envoy-compat") {
		t.Errorf("compat module into the standard archive: %v", err)
	}
	if _, err := runCLI(t, "oci", "build", "--wasm", standard, "--out", "out/kvroute-envoy-compat-oci.tar"); err == nil {
		t.Error("standard module into the envoy-compat archive name was accepted")
	}
}
