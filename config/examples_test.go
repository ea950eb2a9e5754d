package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/scorer"
)

// The example plugin configurations under testdata/ are what users copy: each
// valid one must parse, and each invalid one must fail naming the field a user
// has to fix.
func TestExamplePluginConfigsParse(t *testing.T) {
	files, err := filepath.Glob("../testdata/plugin-config/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example configurations found (%v)", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			_, h, _, err := scorer.Load(data)
			if err != nil {
				t.Fatalf("example does not parse: %v", err)
			}
			if h == nil {
				t.Fatalf("example parsed without a routing handler")
			}
		})
	}
}

func TestExampleInvalidPluginConfigsNameTheField(t *testing.T) {
	want := map[string]string{
		"bad-address.json":            "endpoints[1].address",
		"unknown-key.json":            "stratgey",
		"negative-weight.json":        "profiles.p.scorers[1].weight",
		"pd-threshold-misplaced.json": "pd.threshold",
	}
	files, err := filepath.Glob("../testdata/plugin-config-invalid/*.json")
	if err != nil || len(files) != len(want) {
		t.Fatalf("found %d invalid examples, want %d (%v)", len(files), len(want), err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			_, _, _, err = scorer.Load(data) // config.Parse, then the strategy's checks
			if err == nil {
				t.Fatalf("invalid example was accepted")
			}
			if !strings.Contains(err.Error(), want[name]) {
				t.Fatalf("error does not name %q: %v", want[name], err)
			}
		})
	}
}
