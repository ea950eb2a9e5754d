// Command distbuild builds the Linux artefacts of a release without a
// container engine: the metrics service image and the CLI binaries.
//
//	go run ./internal/deploy/distbuild image   [-out dist/kvroute-metrics-oci.tar] [-platforms linux/amd64,linux/arm64]
//	go run ./internal/deploy/distbuild release [-dir dist/release] [-platforms ...] FILE...
//
// image cross-compiles cmd/kvroute with CGO_ENABLED=0 and -tags metricsonly
// (only `metrics` and `version`) for each platform, checks that each binary
// is statically linked for the right machine, and lays them on a minimal
// non-root base as an OCI image index (internal/deploy/oci.BinaryIndex), written as
// an oci-archive that `kvroute oci push --archive` uploads. This is what ko
// does; no base image is pulled.
//
// release writes into -dir the full CLI for each platform
// (kvroute-linux-amd64, ...), the metrics image, a copy of every FILE given
// (the Wasm modules and their OCI archives, built by make first) and
// SHA256SUMS over all of them, in the format `sha256sum -c` checks.
//
// Every binary carries the release version and the source revision
// (internal/buildinfo), so `kvroute version` names the commit it came from.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "image" && os.Args[1] != "release") {
		fmt.Fprintln(os.Stderr, "usage: distbuild image [-out FILE] [-platforms LIST] | distbuild release [-dir DIR] [-platforms LIST] FILE...")
		os.Exit(2)
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet("distbuild "+mode, flag.ExitOnError)
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "comma-separated OS/ARCH list")
	out := fs.String("out", "dist/"+ImageArchive, "image: where to write the metrics image archive")
	dir := fs.String("dir", "dist/release", "release: the folder to fill")
	fs.Parse(os.Args[2:])

	ctx := context.Background()
	plats, err := parsePlatforms(*platforms)
	if err == nil {
		switch mode {
		case "image":
			err = runImage(ctx, plats, *out)
		case "release":
			err = runRelease(ctx, plats, *dir, fs.Args())
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "distbuild:", err)
		os.Exit(1)
	}
}

func runImage(ctx context.Context, plats []platform, out string) error {
	root, err := repoRoot(ctx)
	if err != nil {
		return err
	}
	res, err := buildImage(ctx, root, plats, out)
	if err != nil {
		return err
	}
	fmt.Printf("distbuild: wrote %s (%s): %s for %s, index %s\n", out, res.Ref, res.Entrypoint, strings.Join(platformNames(plats), ", "), res.Digest)
	return nil
}
