package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/buildinfo"
)

// makeDryRun returns the commands `make -n args...` would run at the
// repository root.
func makeDryRun(t *testing.T, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("SKIPPED: no make on PATH")
	}
	cmd := exec.Command("make", append([]string{"-n", "--no-print-directory"}, args...)...)
	cmd.Dir = filepath.Join("..", "..", "..")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestMakeKeepsTheVariantsApart: `make oci` packages the variant asked for,
// from that variant's own module file into its own archive, so a compat
// build is never packaged as, or replaced by, the standard one; and the
// tests and the demo always use the standard module.
func TestMakeKeepsTheVariantsApart(t *testing.T) {
	std, _ := buildinfo.LookupVariant(buildinfo.VariantStandard)
	compat, _ := buildinfo.LookupVariant(buildinfo.VariantEnvoyCompat)
	for _, c := range []struct {
		args       []string
		v          buildinfo.Variant
		wantCompat bool
	}{
		{[]string{"oci"}, std, false},
		{[]string{"oci", "ENVOY_COMPAT=1.35"}, compat, true},
	} {
		out := makeDryRun(t, c.args...)
		for _, want := range []string{
			"-out dist/" + c.v.WasmFile,
			"oci build --wasm dist/" + c.v.WasmFile + " --out dist/" + c.v.OCIArchive,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("make %s does not run %q:\n%s", strings.Join(c.args, " "), want, out)
			}
		}
		if got := strings.Contains(out, "-envoy-compat 1.35"); got != c.wantCompat {
			t.Errorf("make %s: builds with -envoy-compat = %v, want %v:\n%s", strings.Join(c.args, " "), got, c.wantCompat, out)
		}
	}
	for _, target := range []string{"test", "demo"} {
		out := makeDryRun(t, target, "ENVOY_COMPAT=1.35")
		if strings.Contains(out, "-envoy-compat") || !strings.Contains(out, "go run ./internal/deploy/wasmbuild\n") {
			t.Errorf("make %s ENVOY_COMPAT=1.35 does not build the standard module its tests load:\n%s", target, out)
		}
	}
	release := makeDryRun(t, "release")
	for _, v := range buildinfo.Variants {
		for _, f := range []string{v.WasmFile, v.OCIArchive} {
			if !strings.Contains(release, "dist/"+f) {
				t.Errorf("make release does not ship dist/%s:\n%s", f, release)
			}
		}
	}
}

// compatSpelling finds how a document asks for the envoy-compat build.
var compatSpelling = regexp.MustCompile(`ENVOY_COMPAT=([v0-9.]*)|-envoy-compat[ =](v?1\.\d+)`)

// TestEnvoyCompatHasOneSpelling: every document and the Makefile ask for
// the envoy-compat build the same way, so no reader wonders whether 1.33
// and 1.35 build different modules (they do not).
func TestEnvoyCompatHasOneSpelling(t *testing.T) {
	const want = "1.35"
	root := filepath.Join("..", "..", "..")
	var files []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && p != root || d.Name() == "dist" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if strings.HasSuffix(p, ".md") || d.Name() == "Makefile" {
			files = append(files, p)
		}
		return nil
	})
	if len(files) < 3 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			for _, m := range compatSpelling.FindAllStringSubmatch(line, -1) {
				v := m[1] + m[2]
				if v != want && v != "" && !strings.HasPrefix(v, "$") {
					t.Errorf("%s:%d asks for the envoy-compat build with %q; every document spells it ENVOY_COMPAT=%s", f, i+1, m[0], want)
				}
			}
		}
	}
}

func TestOutputPathPerVariant(t *testing.T) {
	std, _ := buildinfo.LookupVariant(buildinfo.VariantStandard)
	compat, _ := buildinfo.LookupVariant(buildinfo.VariantEnvoyCompat)
	if p, err := outputPath("", compat); err != nil || p != filepath.Join("dist", "kvroute-envoy-compat.wasm") {
		t.Errorf("compat default: %q %v", p, err)
	}
	if p, err := outputPath("", std); err != nil || p != filepath.Join("dist", "kvroute.wasm") {
		t.Errorf("standard default: %q %v", p, err)
	}
	if _, err := outputPath("dist/kvroute.wasm", compat); err == nil || !strings.Contains(err.Error(), "standard module's file name") {
		t.Errorf("compat into the standard file: %v", err)
	}
	if _, err := outputPath("/tmp/x/kvroute-envoy-compat.wasm", std); err == nil {
		t.Error("standard into the compat file name was accepted")
	}
	if p, err := outputPath("/tmp/mine.wasm", compat); err != nil || p != "/tmp/mine.wasm" {
		t.Errorf("a name of the user's own: %q %v", p, err)
	}
}
