// Package buildinfo says which kvroute an artefact is: the release version,
// the source revision, the Go toolchain and, for a Wasm module, the Envoy
// variant it was built for. The CLI reports its own (`kvroute version`);
// internal/deploy/wasmbuild writes a module's into a custom section of the module
// (which Envoy ignores), so `kvroute version FILE.wasm` can read it back
// without running the module, and `kvroute oci build` can name the image
// after it.
//
// This package is for the CLI and the build tools: the Wasm module itself
// only receives a one-line description through the linker (see
// filter/module), so nothing here is compiled into it.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Release is the version this source tree is released as: the top entry of
// CHANGELOG.md (a test keeps them equal).
const Release = "v0.1.0"

// ModulePath is the Go module every artefact is built from.
const ModulePath = "github.com/kvroute/kvroute"

// Set by release builds with -ldflags -X (the Makefile does): the Go
// toolchain's own VCS stamping is often off (GOFLAGS=-buildvcs=false, builds
// outside a checkout), so the revision is passed explicitly.
var (
	version  = Release
	revision = ""
	modified = ""
)

// Info describes one build.
type Info struct {
	// Version is the release version (Release unless the build set another).
	Version string `json:"version"`
	// Revision is the source commit, empty when unknown.
	Revision string `json:"revision,omitempty"`
	// Modified is true when the tree had uncommitted changes.
	Modified bool `json:"modified,omitempty"`
	// Go is the toolchain version, e.g. go1.26.8.
	Go string `json:"go"`
	// Variant is the Envoy variant of a Wasm module: VariantStandard or
	// VariantEnvoyCompat. Empty for binaries.
	Variant string `json:"variant,omitempty"`
}

// String is the one-line form logged by the module and printed by the CLI:
// "v0.1.0 (revision 0123456789ab, go1.26.8)".
func (i Info) String() string {
	rev := "revision unknown"
	if i.Revision != "" {
		r := i.Revision
		if len(r) > 12 {
			r = r[:12]
		}
		rev = "revision " + r
		if i.Modified {
			rev += " with uncommitted changes"
		}
	}
	return fmt.Sprintf("%s (%s, %s)", i.Version, rev, i.Go)
}

// Binary returns the running binary's build. The revision comes from the
// linker flags when set, else from the Go toolchain's VCS stamp.
func Binary() Info {
	info := Info{Version: version, Revision: revision, Modified: modified == "true", Go: runtime.Version()}
	if info.Revision != "" {
		return info
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	return info
}

// MainModule returns the path and version the Go toolchain recorded for
// the running binary's main module ("(devel)" for a build from a checkout
// without a tag), or empty strings when the binary carries no build info.
func MainModule() (path, version string) {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Path, bi.Main.Version
	}
	return "", ""
}
