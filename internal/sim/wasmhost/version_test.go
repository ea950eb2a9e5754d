package wasmhost

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/buildinfo"
	"github.com/kvroute/kvroute/internal/testenv"
)

// TestModuleLogsItsVersionOncePerVM: every VM (one per Envoy worker) logs
// one info line at start naming the module's version, revision and Envoy
// variant, the same facts its kvroute.buildinfo section records, so an
// operator can tell from Envoy's log which module each worker runs.
func TestModuleLogsItsVersionOncePerVM(t *testing.T) {
	module := testenv.Module(t)
	info, err := buildinfo.FromWasm(module)
	if err != nil {
		t.Fatalf("dist/kvroute.wasm: %v", err)
	}
	const workers = 3
	h, _ := startHost(t, Config{Module: module, VMID: "kvroute", Workers: workers,
		Filters:  []Filter{{RootID: "kvroute.router", Configuration: routerConfig([]string{"127.0.0.1:1"}, ""), AllowOnHeadersStopIteration: true}},
		Clusters: map[string][]string{"engines": {"127.0.0.1:1"}}, RouteCluster: "engines"})
	perWorker := map[int]int{}
	for _, e := range h.LogsContaining("VM started") {
		perWorker[e.Worker]++
		if e.Level != LevelInfo {
			t.Errorf("worker %d logs its start at level %d, want info", e.Worker, e.Level)
		}
		wants := []string{"kvroute " + info.Version, info.Go, info.Variant + " build"}
		if len(info.Revision) >= 12 {
			wants = append(wants, "revision "+info.Revision[:12])
		}
		for _, want := range wants {
			if !strings.Contains(e.Message, want) {
				t.Errorf("start line %q lacks %q", e.Message, want)
			}
		}
	}
	if len(perWorker) != workers {
		t.Errorf("start lines from %d workers, want %d: %v", len(perWorker), workers, h.LogsContaining("VM started"))
	}
	for w, n := range perWorker {
		if n != 1 {
			t.Errorf("worker %d logged its start %d times, want once", w, n)
		}
	}
}
