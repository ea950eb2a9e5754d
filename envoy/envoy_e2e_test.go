package envoy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/testenv"
)

// TestEnvoyValidateMode asks a real Envoy to load each standalone bootstrap in
// --mode validate (which builds every listener, filter and cluster, loading
// the Wasm module, without serving). No Envoy can be installed where the
// project is built, so this runs only when ENVOY_BIN names one.
func TestEnvoyValidateMode(t *testing.T) {
	bin := os.Getenv("ENVOY_BIN")
	if bin == "" {
		t.Skip("SKIPPED: ENVOY_BIN is not set, so no real Envoy validated the bootstraps (set ENVOY_BIN=/path/to/envoy, >= 1.35)")
	}
	wasm := testenv.ModulePath(t)
	for _, name := range []string{"standalone/envoy.yaml", "standalone/envoy-original-dst.yaml"} {
		t.Run(name, func(t *testing.T) {
			cfg := strings.ReplaceAll(string(read(t, name)), "/etc/envoy/kvroute.wasm", wasm)
			path := filepath.Join(t.TempDir(), filepath.Base(name))
			if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, "--mode", "validate", "-c", path, "--log-level", "warn").CombinedOutput()
			if err != nil {
				t.Fatalf("envoy --mode validate %s: %v\n%s", name, err, out)
			}
		})
	}
}
