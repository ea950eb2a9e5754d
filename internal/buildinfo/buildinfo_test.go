package buildinfo

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
)

// minimalModule is a valid Wasm module with one type section and nothing else.
var minimalModule = []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x01, 0x60, 0x00, 0x00}

func TestWasmRecordRoundTrip(t *testing.T) {
	want := Info{Version: "v1.2.3", Revision: strings.Repeat("ab", 20), Modified: true, Go: "go1.26.8", Variant: VariantEnvoyCompat}
	out, err := AppendToWasm(minimalModule, want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := FromWasm(out)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("read back %+v, want %+v", got, want)
	}
	// The module stays valid: a runtime compiles it, ignoring the section.
	r := wazero.NewRuntime(context.Background())
	defer r.Close(context.Background())
	if _, err := r.CompileModule(context.Background(), out); err != nil {
		t.Errorf("the module with its record does not compile: %v", err)
	}
	if _, err := AppendToWasm(out, want); err == nil {
		t.Error("a second record was appended")
	}
}

func TestFromWasmErrors(t *testing.T) {
	if _, err := FromWasm(minimalModule); !errors.Is(err, ErrNoWasmInfo) {
		t.Errorf("module without a record: %v, want ErrNoWasmInfo", err)
	}
	if _, err := FromWasm([]byte("hello world")); err == nil || !strings.Contains(err.Error(), "not a binary Wasm module") {
		t.Errorf("not Wasm: %v", err)
	}
	rec, _ := AppendToWasm(minimalModule, Info{Version: "v1"})
	if _, err := FromWasm(rec[:len(rec)-3]); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated: %v", err)
	}
}

func TestVariantsKeepTheirArtefactsApart(t *testing.T) {
	seen := map[string]string{}
	for _, v := range Variants {
		for _, name := range []string{v.WasmFile, v.OCIArchive, v.ImageTag("v1")} {
			if other, dup := seen[name]; dup {
				t.Errorf("%s and %s share %s", v.Name, other, name)
			}
			seen[name] = v.Name
		}
	}
	if _, err := LookupVariant("compat"); err == nil {
		t.Error("an unknown variant name was accepted")
	}
}

// TestChangelogNamesTheRelease: the version every artefact reports is the
// CHANGELOG's top entry.
func TestChangelogNamesTheRelease(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## \[?(v?\d+\.\d+\.\d+[^\]\s]*)`).FindStringSubmatch(string(data))
	if m == nil {
		t.Fatal("CHANGELOG.md has no release heading (## v1.2.3 ...)")
	}
	if got := "v" + strings.TrimPrefix(m[1], "v"); got != Release {
		t.Errorf("CHANGELOG.md's top release is %s, buildinfo.Release is %s", got, Release)
	}
}

func TestInfoString(t *testing.T) {
	s := Info{Version: "v1", Revision: "0123456789abcdef", Modified: true, Go: "go1.26"}.String()
	if s != "v1 (revision 0123456789ab with uncommitted changes, go1.26)" {
		t.Errorf("String() = %q", s)
	}
	if s := (Info{Version: "v1", Go: "go1.26"}).String(); !strings.Contains(s, "revision unknown") {
		t.Errorf("String() = %q", s)
	}
	flags := Info{Version: "v1", Revision: "abc", Modified: true}.LDFlags()
	for _, want := range []string{"internal/buildinfo.version=v1", "internal/buildinfo.revision=abc", "internal/buildinfo.modified=true"} {
		if !strings.Contains(flags, want) {
			t.Errorf("LDFlags() = %q lacks %q", flags, want)
		}
	}
}
