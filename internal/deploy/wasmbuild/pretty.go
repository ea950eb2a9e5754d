package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// gjson imports github.com/tidwall/pretty for its @pretty and @ugly
// modifiers, which it registers in a package-level map, so the linker keeps
// them. pretty's key sorting unescapes keys with encoding/json.Unmarshal, and
// that one call links encoding/json, reflection-based decoder and all, into
// the module (about 570 KB of a stripped build) that otherwise reads JSON
// only with gjson. The overlay unescapes with strconv.Unquote instead: it
// only orders keys for @pretty with sortKeys, which kvroute never asks for.
const prettyModule = "github.com/tidwall/pretty"

var prettyEdits = []edit{
	{old: "\t\"encoding/json\"\n", new: "", why: "pretty.go imports encoding/json"},
	{old: "json.Unmarshal(s, &str)", new: "if u, err := strconv.Unquote(string(s)); err == nil {\n\t\t\t\tstr = u\n\t\t\t}",
		why: "parsestr unescapes a key with json.Unmarshal"},
}

// writePrettyPatch copies the pretty module the repository requires to
// work/pretty with pretty.go patched, and returns the go.work replace line
// that builds with it (the module cache itself cannot be overlaid).
func writePrettyPatch(ctx context.Context, root, work string) (string, error) {
	out, err := goCmd(ctx, root, nil, "list", "-m", "-f", "{{.Dir}} {{.Version}}", prettyModule)
	if err != nil {
		return "", err
	}
	dir, version, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	dst := filepath.Join(work, "pretty")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", err
	}
	for _, name := range []string{"go.mod", "LICENSE", "pretty.go"} {
		src, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("reading %s to patch: %w", prettyModule, err)
		}
		if name == "pretty.go" {
			text := string(src)
			for _, e := range prettyEdits {
				if n := strings.Count(text, e.old); n != 1 {
					return "", fmt.Errorf("%s %s: expected the code where %s exactly once, found it %d times; this release changed it: update internal/deploy/wasmbuild/pretty.go", prettyModule, version, e.why, n)
				}
				text = strings.Replace(text, e.old, e.new, 1)
			}
			src = []byte(text)
		}
		if err := writeFileAtomic(filepath.Join(dst, name), src); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("replace %s %s => ./pretty\n", prettyModule, version), nil
}
