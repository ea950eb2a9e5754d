package scorer

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The Wasm filter links this package: its configuration is read with gjson,
// like the rest of the filter's, so it must not bring in encoding/json (a
// reflection-based decoder the module would otherwise carry for it alone).
func TestNoReflectionJSONDecoder(t *testing.T) {
	for _, dir := range []string{".", "../config"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			ast, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range ast.Imports {
				if p, _ := strconv.Unquote(imp.Path.Value); p == "encoding/json" || p == "reflect" {
					t.Errorf("%s imports %s: read configuration with gjson instead", f, p)
				}
			}
		}
	}
}
