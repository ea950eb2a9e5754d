package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// The module reads JSON only with gjson; encoding/json would come in through
// gjson's dependency github.com/tidwall/pretty unless the build patches it
// (pretty.go). This lists what the Wasm build of the filter links, with the
// build's own workspace and overlay.
func TestModuleLinksNoEncodingJSON(t *testing.T) {
	ctx := context.Background()
	root, err := repoRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(root, ".wasmbuild")
	sdkDir, err := copySDK(ctx, root, work)
	if err != nil {
		t.Fatal(err)
	}
	prettyReplace, err := writePrettyPatch(ctx, root, work)
	if err != nil {
		t.Fatal(err)
	}
	goWork, err := writeGoWork(work, sdkDir, prettyReplace)
	if err != nil {
		t.Fatal(err)
	}
	overlay, err := writeOverlay(ctx, work, sdkDir, envoyCompat{})
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOWORK=" + goWork}
	out, err := goCmd(ctx, root, env, "list", "-deps", "-overlay", overlay, "./filter/module")
	if err != nil {
		t.Fatal(err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 20 {
		t.Fatalf("go list -deps ./filter/module listed %d packages: %v", len(deps), deps)
	}
	for _, d := range deps {
		if d == "encoding/json" {
			t.Errorf("the Wasm module links encoding/json: find the importer with GOOS=wasip1 GOARCH=wasm go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./filter/module and read it with gjson instead")
		}
	}
}
