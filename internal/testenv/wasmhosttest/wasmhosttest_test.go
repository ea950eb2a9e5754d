package wasmhosttest

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/sim/wasmhost"
)

// fatalRecorder is a testing.TB whose Fatal and Fatalf record the message
// and end the goroutine, as testing.T's do.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatal(args ...any) {
	r.msg = fmt.Sprint(args...)
	runtime.Goexit()
}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// A plugin that refuses its configuration fails the test with the
// plugin's name and the module's log, which says what to fix.
func TestStartQuotesTheModuleLogWhenAPluginRefuses(t *testing.T) {
	mod, err := os.ReadFile(filepath.Join("..", "..", "..", "dist", "kvroute.wasm"))
	if err != nil {
		t.Fatalf("dist/kvroute.wasm is missing (%v): run make wasm (make test builds it first)", err)
	}
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(rec, wasmhost.Config{Module: mod, VMID: "kvroute",
			Filters:  []wasmhost.Filter{{RootID: "kvroute.router", Configuration: `{"endpoints":[{"address":"127.0.0.1:1"}],"strategy":"no_such_strategy"}`}},
			Clusters: map[string][]string{"engines": {"127.0.0.1:1"}}, RouteCluster: "engines"})
		t.Error("Start returned for a configuration the router refuses")
	}()
	<-done
	if !strings.Contains(rec.msg, "kvroute.router") || !strings.Contains(rec.msg, "no_such_strategy") {
		t.Errorf("Start failed with %q, want New's error, with the module's log naming the bad strategy", rec.msg)
	}
}
