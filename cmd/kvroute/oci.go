package main

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/internal/oci"
)

// The oci command packages dist/kvroute.wasm as the OCI image Istio's
// WasmPlugin and Envoy Gateway's EnvoyExtensionPolicy pull (see internal/oci).
func init() {
	var (
		wasmPath    string
		outPath     string
		refName     string
		annotations []string
	)
	build := &cobra.Command{
		Use:   "build",
		Short: "Write the Wasm module as a compat-variant OCI image archive (oci-archive tar)",
		Long: `Build packs the module into a one-layer OCI image (plugin.wasm in a tar.gz
layer, annotation module.wasm.image/variant=compat) and writes it as an OCI
image layout tar. Push it with 'kvroute oci push', or with
'skopeo copy oci-archive:dist/kvroute-oci.tar docker://REGISTRY/kvroute:TAG'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			img, module, err := buildImage(wasmPath, annotations)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Dir(outPath), 0o755); err != nil {
				return err
			}
			if err := oci.WriteArchiveFile(outPath, img, refName); err != nil {
				return err
			}
			return describe(cmd, outPath, img, module)
		},
	}
	build.Flags().StringVar(&wasmPath, "wasm", "dist/kvroute.wasm", "the Wasm module to package (written by make wasm)")
	build.Flags().StringVar(&outPath, "out", "dist/kvroute-oci.tar", "where to write the OCI image archive")
	build.Flags().StringVar(&refName, "tag", "kvroute:latest", "reference name recorded in the archive's index")
	build.Flags().StringArrayVar(&annotations, "annotation", nil, "extra manifest annotation KEY=VALUE (repeatable), e.g. org.opencontainers.image.revision=$(git rev-parse HEAD)")

	var (
		pushWasm    string
		pushArchive string
		insecure    bool
		pushAnns    []string
	)
	push := &cobra.Command{
		Use:   "push REF",
		Short: "Push the image to a registry (credentials from the Docker config)",
		Long: `Push uploads the compat-variant image to REF (registry/repository:tag), built
from --wasm or read from an archive written by 'oci build' (--archive), and
prints the digest reference to pin in the manifests.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var (
				img    v1.Image
				module []byte
				err    error
			)
			if pushArchive != "" {
				if cmd.Flags().Changed("wasm") {
					return errors.New("give --wasm or --archive, not both")
				}
				if img, err = oci.ReadArchive(pushArchive); err != nil {
					return err
				}
				if module, err = oci.ExtractPlugin(img); err != nil {
					return err
				}
			} else if img, module, err = buildImage(pushWasm, pushAnns); err != nil {
				return err
			}
			ref, err := oci.Push(cmd.Context(), args[0], img, oci.PushOptions{Insecure: insecure})
			if err != nil {
				return err
			}
			if err := describe(cmd, args[0], img, module); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pinned reference: %s\n", ref)
			return nil
		},
	}
	push.Flags().StringVar(&pushWasm, "wasm", "dist/kvroute.wasm", "the Wasm module to package and push")
	push.Flags().StringVar(&pushArchive, "archive", "", "push this archive from 'oci build' instead of building from --wasm")
	push.Flags().BoolVar(&insecure, "insecure", false, "allow plain HTTP (a local test registry)")
	push.Flags().StringArrayVar(&pushAnns, "annotation", nil, "extra manifest annotation KEY=VALUE (repeatable)")

	root := groupCommand("oci", "Package the Wasm module as an OCI image for Istio and Envoy Gateway")
	root.AddCommand(build, push)
	addCommand(root)
}

func buildImage(wasmPath string, annotations []string) (v1.Image, []byte, error) {
	module, err := os.ReadFile(wasmPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("%s does not exist: run `make wasm` first or pass --wasm", wasmPath)
		}
		return nil, nil, err
	}
	anns := map[string]string{}
	for _, a := range annotations {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, nil, fmt.Errorf("--annotation %q: want KEY=VALUE", a)
		}
		anns[k] = v
	}
	img, err := oci.Build(module, oci.Options{Annotations: anns})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", wasmPath, err)
	}
	return img, module, nil
}

// describe prints the two checksums users need: the image digest (pinned by
// Envoy Gateway's image sha256 and by a digest reference in Istio) and the
// module's own sha256 (Envoy's remote code source sha256), and the size a
// gateway downloads, so no document has to copy it.
func describe(cmd *cobra.Command, where string, img v1.Image, module []byte) error {
	d, err := img.Digest()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var layerBytes int64
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return err
		}
		layerBytes += n
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "wrote %s\n", where)
	fmt.Fprintf(w, "image digest:       %s\n", d)
	fmt.Fprintf(w, "plugin.wasm sha256: %x (%d bytes)\n", sha256.Sum256(module), len(module))
	fmt.Fprintf(w, "layer size:         %d bytes compressed (what a registry stores and a gateway fetches)\n", layerBytes)
	return nil
}
