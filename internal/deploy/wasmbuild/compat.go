package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/buildinfo"
)

// envoyCompat describes the -envoy-compat build variant.
//
// Envoy before 1.39 answers WASI poll_oneoff with an error (ENOTSUP/ENOSYS).
// Go's wasip1 runtime calls poll_oneoff from netpoll, which the scheduler runs
// whenever the world restarts after a GC stop (startTheWorldWithSema calls
// netpoll(0), which always carries a clock subscription), and from usleep; it
// treats any error but EINTR as fatal ("fatal error: poll_oneoff failed",
// golang/go#78513). A filter therefore traps at its first GC cycles after
// hours of traffic. The compat build patches those two runtime functions to
// treat a failed poll_oneoff as "no events" / "slept", which is what a host
// without poll support means. A kvroute filter never waits on file
// descriptors or timers inside a callback, so nothing is lost; the one cost is
// that a goroutine sleeping on a timer (none in kvroute) would spin instead of
// block.
type envoyCompat struct {
	enabled bool
	version string // "1.33" .. "1.38"
}

// firstFixedEnvoyMinor is the first Envoy 1.x release whose host implements
// poll_oneoff well enough for Go's runtime.
const firstFixedEnvoyMinor = 39

// oldestGoWasip1EnvoyMinor is the first Envoy 1.x release that loads Go
// wasip1 (wasmexport) modules at all.
const oldestGoWasip1EnvoyMinor = 33

// variant is the build's entry in buildinfo.Variants.
func (c envoyCompat) variant() buildinfo.Variant {
	name := buildinfo.VariantStandard
	if c.enabled {
		name = buildinfo.VariantEnvoyCompat
	}
	v, _ := buildinfo.LookupVariant(name)
	return v
}

func parseEnvoyCompat(s string) (envoyCompat, error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	if s == "" {
		return envoyCompat{}, nil
	}
	parts := strings.Split(s, ".")
	if len(parts) < 2 || parts[0] != "1" {
		return envoyCompat{}, fmt.Errorf("-envoy-compat %q: give an Envoy version such as 1.33", s)
	}
	minor, err := strconv.Atoi(parts[1])
	if err != nil {
		return envoyCompat{}, fmt.Errorf("-envoy-compat %q: give an Envoy version such as 1.33", s)
	}
	switch {
	case minor < oldestGoWasip1EnvoyMinor:
		return envoyCompat{}, fmt.Errorf("-envoy-compat %s: Envoy before 1.%d cannot load modules built by the official Go toolchain; upgrade Envoy or use `make wasm-tinygo`", s, oldestGoWasip1EnvoyMinor)
	case minor >= firstFixedEnvoyMinor:
		return envoyCompat{}, fmt.Errorf("-envoy-compat %s: Envoy 1.%d and later implement poll_oneoff; build without ENVOY_COMPAT", s, firstFixedEnvoyMinor)
	}
	return envoyCompat{enabled: true, version: fmt.Sprintf("1.%d", minor)}, nil
}

// runtimePatch is one textual edit of a Go runtime source file. Each anchor
// must occur exactly once; if a Go release changes these lines, the build
// fails and names the file instead of silently shipping an unpatched runtime.
type runtimePatch struct {
	file  string // under $GOROOT/src/runtime
	edits []edit
}

type edit struct {
	old, new string
	why      string
}

var runtimePatches = []runtimePatch{
	{
		file: "netpoll_wasip1.go",
		edits: []edit{{
			old: "\t\tif errno != _EINTR {\n\t\t\tprintln(\"errno=\", errno, \" len(pollsubs)=\", len(pollsubs))\n\t\t\tthrow(\"poll_oneoff failed\")\n\t\t}\n",
			new: "\t\tif errno != _EINTR {\n\t\t\t// kvroute envoy-compat (golang/go#78513): the host cannot poll; report no events.\n\t\t\tunlock(&mtx)\n\t\t\treturn gList{}, 0\n\t\t}\n",
			why: "netpoll throws when poll_oneoff fails",
		}},
	},
	{
		file: "os_wasip1.go",
		edits: []edit{{
			old: "\tif poll_oneoff(&in, &out, 1, &nevents) != 0 {\n\t\tthrow(\"wasi_snapshot_preview1.poll_oneoff\")\n\t}\n",
			new: "\t// kvroute envoy-compat (golang/go#78513): a host that cannot poll cannot sleep either.\n\t_ = poll_oneoff(&in, &out, 1, &nevents)\n",
			why: "usleep throws when poll_oneoff fails",
		}},
	},
}

// applyPatch returns src with every edit applied, or an error naming the
// first anchor that is missing or ambiguous.
func applyPatch(file string, src []byte, edits []edit) ([]byte, error) {
	text := string(src)
	for _, e := range edits {
		switch n := strings.Count(text, e.old); n {
		case 1:
			text = strings.Replace(text, e.old, e.new, 1)
		default:
			return nil, fmt.Errorf("runtime/%s: expected the code where %s exactly once, found it %d times; this Go release changed it: update internal/deploy/wasmbuild/compat.go", file, e.why, n)
		}
	}
	return []byte(text), nil
}

// writeRuntimePatch writes patched copies of the runtime files under
// work/compat and returns the overlay entries (GOROOT path -> patched copy).
// Only the local toolchain's own sources are read; nothing is downloaded.
func writeRuntimePatch(ctx context.Context, work string) (map[string]string, error) {
	out, err := goCmd(ctx, "", nil, "env", "GOROOT")
	if err != nil {
		return nil, err
	}
	goroot := strings.TrimSpace(string(out))
	dir := filepath.Join(work, "compat", "runtime")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	replace := map[string]string{}
	for _, p := range runtimePatches {
		orig := filepath.Join(goroot, "src", "runtime", p.file)
		src, err := os.ReadFile(orig)
		if err != nil {
			return nil, fmt.Errorf("reading the Go runtime source to patch: %w", err)
		}
		patched, err := applyPatch(p.file, src, p.edits)
		if err != nil {
			return nil, err
		}
		dst := filepath.Join(dir, p.file)
		if err := writeFileAtomic(dst, patched); err != nil {
			return nil, err
		}
		replace[orig] = dst
	}
	return replace, nil
}
