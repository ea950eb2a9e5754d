package testenv

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/kvroute/kvroute/"

// imports lists every package of the repository with the packages its
// non-test files import, module paths relative to the repository root.
func imports(t *testing.T, env []string, pattern string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}|{{join .Imports \",\"}}", pattern)
	cmd.Env = append(cmd.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pattern, err)
	}
	pkgs := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, deps, _ := strings.Cut(line, "|")
		var own []string
		for _, d := range strings.Split(deps, ",") {
			if rel, ok := strings.CutPrefix(d, module); ok {
				own = append(own, rel)
			}
		}
		pkgs[strings.TrimPrefix(path, module)] = own
	}
	return pkgs
}

func under(path, dir string) bool { return path == dir || strings.HasPrefix(path, dir+"/") }

// Only tests import a test host or harness: shipped code, the service,
// the simulator and the deploy tools build without them.
func TestOnlyTestsImportTestenv(t *testing.T) {
	for pkg, deps := range imports(t, nil, module+"...") {
		if under(pkg, "internal/testenv") {
			continue
		}
		for _, d := range deps {
			if under(d, "internal/testenv") {
				t.Errorf("%s imports %s: only _test.go files may import internal/testenv (a host that non-test code needs belongs by its role, as internal/sim/wasmhost does)", pkg, d)
			}
		}
	}
}

// The packages compiled into the Wasm module live at the top level, so the
// tree shows what runs in Envoy, and they import nothing under internal/:
// no service, simulator, deploy tool or test host.
func TestModuleImportsNoInternalPackage(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", module+"filter/module")
	cmd.Env = append(cmd.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps filter/module: %v", err)
	}
	n := 0
	for _, p := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(p, module)
		if !ok {
			continue
		}
		n++
		if under(rel, "internal") || under(rel, "cmd") {
			t.Errorf("the Wasm module links %s: code compiled into the module lives at the top level (docs/architecture.md, Layout)", rel)
		}
	}
	if n < 5 {
		t.Fatalf("go list found %d kvroute packages in the module: %s", n, out)
	}
}

// The metrics service and the deploy tools ship: they import neither the
// simulator nor a test host. (The simulator may use the deploy tools'
// manifest readers, and the command wires everything.)
func TestShippedToolsImportNoSimulator(t *testing.T) {
	for pkg, deps := range imports(t, nil, module+"...") {
		if !under(pkg, "internal/metricsvc") && !under(pkg, "internal/deploy") {
			continue
		}
		for _, d := range deps {
			if under(d, "internal/sim") || under(d, "internal/testenv") {
				t.Errorf("%s imports %s: the service and the deploy tools must not depend on the simulator or a test host", pkg, d)
			}
		}
	}
}
