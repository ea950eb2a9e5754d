package v8host

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A module that does not load is an error from Start that says what node
// saw, not a host that never listens.
func TestStartReportsAModuleThatDoesNotLoad(t *testing.T) {
	if err := Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.wasm")
	os.WriteFile(bad, []byte("\x00asm\x01\x00\x00\x00\x05garbage"), 0o644)
	h, err := Start(Config{Module: bad, RootID: "kvroute.router", Configuration: "{}"})
	if err == nil {
		h.Close()
		t.Fatal("Start succeeded with a malformed module")
	}
	if !strings.Contains(err.Error(), "node exited before listening") || !strings.Contains(err.Error(), "CompileError") {
		t.Errorf("error %q should say node exited and quote V8's CompileError", err)
	}
}
