//go:build !metricsonly

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

	"github.com/kvroute/kvroute/internal/buildinfo"
	"github.com/kvroute/kvroute/internal/deploy/oci"
)

// The oci command packages dist/kvroute.wasm as the OCI image Istio's
// WasmPlugin and Envoy Gateway's EnvoyExtensionPolicy pull (see internal/deploy/oci).
func init() {
	readArchiveModule = func(path string) ([]byte, error) {
		img, err := oci.ReadArchive(path)
		if err != nil {
			return nil, err
		}
		return oci.ExtractPlugin(img)
	}
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
'skopeo copy oci-archive:dist/kvroute-oci.tar docker://REGISTRY/kvroute:TAG'.

The module's build record (see 'kvroute version') picks the defaults, so the
two Envoy variants never share a file: the standard module (Envoy 1.39 and
later) goes to dist/kvroute-oci.tar as kvroute:VERSION, the envoy-compat module
(Envoy 1.33 to 1.38) to dist/kvroute-envoy-compat-oci.tar as
kvroute:VERSION-envoy-compat. The manifest carries the version, the revision
and the variant as annotations.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			img, module, info, err := buildImage(wasmPath, annotations)
			if err != nil {
				return err
			}
			if outPath, refName, err = variantOutputs(info, outPath, refName); err != nil {
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
	build.Flags().StringVar(&outPath, "out", "", "where to write the OCI image archive (default: dist/kvroute-oci.tar, or dist/kvroute-envoy-compat-oci.tar for an envoy-compat module)")
	build.Flags().StringVar(&refName, "tag", "", "reference name recorded in the archive's index (default: kvroute:VERSION, with -envoy-compat for that variant)")
	build.Flags().StringArrayVar(&annotations, "annotation", nil, "extra manifest annotation KEY=VALUE (repeatable), e.g. org.opencontainers.image.revision=$(git rev-parse HEAD)")

	var (
		pushWasm    string
		pushArchive string
		insecure    bool
		pushAnns    []string
	)
	push := &cobra.Command{
		Use:   "push REF",
		Short: "Push an image to a registry (credentials from the Docker config)",
		Long: `Push uploads an image to REF (registry/repository:tag) and prints the digest
reference to pin in the manifests. The image is the Wasm module's, built from
--wasm, or one read from an archive (--archive): the Wasm image 'oci build'
writes, or the multi-platform metrics service image 'make image' writes
(dist/kvroute-metrics-oci.tar), which is pushed as its image index.`,
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
				a, err := oci.ReadArchiveArtifact(pushArchive)
				if err != nil {
					return err
				}
				if a.Index != nil {
					return pushIndex(cmd, args[0], a.Index, insecure)
				}
				img = a.Image
				if module, err = oci.ExtractPlugin(img); err != nil {
					return err
				}
			} else if img, module, _, err = buildImage(pushWasm, pushAnns); err != nil {
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

// pushIndex pushes a multi-platform image and prints its digest and platforms.
func pushIndex(cmd *cobra.Command, ref string, idx v1.ImageIndex, insecure bool) error {
	pinned, err := oci.Push(cmd.Context(), ref, idx, oci.PushOptions{Insecure: insecure})
	if err != nil {
		return err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	var plats []string
	for _, m := range im.Manifests {
		if m.Platform != nil {
			plats = append(plats, m.Platform.String())
		}
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "wrote %s\n", ref)
	fmt.Fprintf(w, "platforms:        %s\n", strings.Join(plats, ", "))
	fmt.Fprintf(w, "pinned reference: %s\n", pinned)
	return nil
}

// buildImage packs the module at wasmPath. The annotations say which build
// it is (from the module's build record, when it has one); those given on
// the command line win.
func buildImage(wasmPath string, annotations []string) (v1.Image, []byte, buildinfo.Info, error) {
	module, err := os.ReadFile(wasmPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, buildinfo.Info{}, fmt.Errorf("%s does not exist: run `make wasm` first or pass --wasm", wasmPath)
		}
		return nil, nil, buildinfo.Info{}, err
	}
	info, _ := buildinfo.FromWasm(module) // a module without a record gets no build annotations
	anns := map[string]string{}
	if info.Version != "" {
		anns[oci.VersionAnnotation] = info.Version
	}
	if info.Revision != "" {
		anns[oci.RevisionAnnotation] = info.Revision
	}
	if info.Variant != "" {
		anns[oci.EnvoyVariantAnnotation] = info.Variant
	}
	for _, a := range annotations {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, nil, buildinfo.Info{}, fmt.Errorf("--annotation %q: want KEY=VALUE", a)
		}
		anns[k] = v
	}
	img, err := oci.Build(module, oci.Options{Annotations: anns})
	if err != nil {
		return nil, nil, buildinfo.Info{}, fmt.Errorf("%s: %w", wasmPath, err)
	}
	return img, module, info, nil
}

// variantOutputs fills in the archive path and reference name the module's
// variant calls for, and refuses an archive path named after the other
// variant's archive (how one build would silently replace the other).
func variantOutputs(info buildinfo.Info, out, ref string) (string, string, error) {
	name := info.Variant
	if name == "" {
		name = buildinfo.VariantStandard // a module without a build record
	}
	v, err := buildinfo.LookupVariant(name)
	if err != nil {
		return "", "", err
	}
	if out == "" {
		out = filepath.Join("dist", v.OCIArchive)
	}
	for _, other := range buildinfo.Variants {
		if info.Variant != "" && other.Name != v.Name && filepath.Base(out) == other.OCIArchive {
			return "", "", fmt.Errorf("--out %s is the %s image's archive name; this module is the %s build (its archive: %s)", out, other.Name, v.Name, v.OCIArchive)
		}
	}
	if ref == "" {
		ver := info.Version
		if ver == "" {
			ver = "latest"
		}
		ref = "kvroute:" + v.ImageTag(ver)
	}
	return out, ref, nil
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
