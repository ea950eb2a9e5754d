package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/spf13/pflag"

	"github.com/kvroute/kvroute/internal/deploy/oci"
)

// runCLI runs `kvroute args...` through the real cobra tree and returns
// its stdout.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := execCLI(t, context.Background(), &out, args...)
	return out.String(), err
}

// execCLI runs `kvroute args...` with ctx, writing stdout to out. The
// flags of the command it ran are put back to their defaults afterwards,
// since cobra keeps parsed values (and the first run's context) between
// runs and other tests share the tree.
func execCLI(t *testing.T, ctx context.Context, out io.Writer, args ...string) error {
	t.Helper()
	cmd, _, err := rootCmd.Find(args)
	if err != nil {
		t.Fatalf("kvroute %s: %v", strings.Join(args, " "), err)
	}
	defer func() {
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if sv, ok := f.Value.(pflag.SliceValue); ok {
				sv.Replace(nil)
			} else {
				f.Value.Set(f.DefValue)
			}
			f.Changed = false
		})
		cmd.SetContext(nil)
		rootCmd.SetArgs(nil)
		rootCmd.SetOut(nil)
		rootCmd.SetErr(nil)
	}()
	rootCmd.SetArgs(args)
	rootCmd.SetOut(out)
	rootCmd.SetErr(io.Discard)
	return rootCmd.ExecuteContext(ctx)
}

// syntheticWasm writes a file with a binary Wasm header and n bytes that
// vary with seed, so the test needs no `make wasm`.
func syntheticWasm(t *testing.T, seed byte, n int) (string, []byte) {
	t.Helper()
	module := []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}
	for i := range n {
		module = append(module, byte(i*7)^seed)
	}
	path := filepath.Join(t.TempDir(), "plugin.wasm")
	if err := os.WriteFile(path, module, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, module
}

func TestOCIBuildWritesTheModuleIntoTheArchive(t *testing.T) {
	wasm, module := syntheticWasm(t, 3, 5000)
	out := filepath.Join(t.TempDir(), "sub", "kvroute-oci.tar")
	stdout, err := runCLI(t, "oci", "build", "--wasm", wasm, "--out", out,
		"--annotation", "org.opencontainers.image.revision=abc123")
	if err != nil {
		t.Fatal(err)
	}
	img, err := oci.ReadArchive(out)
	if err != nil {
		t.Fatalf("the archive `oci build` wrote does not read back: %v", err)
	}
	got, err := oci.ExtractPlugin(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, module) {
		t.Fatalf("plugin.wasm in the archive differs from the input (%d vs %d bytes)", len(got), len(module))
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Annotations[oci.VariantAnnotation] != oci.VariantCompat || m.Annotations["org.opencontainers.image.revision"] != "abc123" {
		t.Errorf("manifest annotations = %v", m.Annotations)
	}
	digest, _ := img.Digest()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers = %d, %v; want one", len(layers), err)
	}
	layerSize, _ := layers[0].Size()
	for _, want := range []string{
		"wrote " + out,
		fmt.Sprintf("layer size:         %d bytes compressed", layerSize),
		"image digest:       " + digest.String(),
		fmt.Sprintf("plugin.wasm sha256: %x (%d bytes)", sha256.Sum256(module), len(module)),
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
}

func TestOCIBuildBadInput(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "kvroute-oci.tar")
	missing := filepath.Join(dir, "nope.wasm")
	_, err := runCLI(t, "oci", "build", "--wasm", missing, "--out", out)
	if err == nil || !strings.Contains(err.Error(), missing+" does not exist") || !strings.Contains(err.Error(), "make wasm") {
		t.Errorf("missing --wasm file: error %v, want it to name the file and say to run `make wasm`", err)
	}

	notWasm := filepath.Join(dir, "notes.txt")
	os.WriteFile(notWasm, []byte("hello"), 0o644)
	if _, err := runCLI(t, "oci", "build", "--wasm", notWasm, "--out", out); err == nil || !strings.Contains(err.Error(), "not a binary Wasm module") {
		t.Errorf("non-Wasm input: error %v", err)
	}

	wasm, _ := syntheticWasm(t, 1, 100)
	if _, err := runCLI(t, "oci", "build", "--wasm", wasm, "--out", out, "--annotation", "novalue"); err == nil || !strings.Contains(err.Error(), "want KEY=VALUE") {
		t.Errorf("bad --annotation: error %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a failed build left %s behind (stat: %v)", out, err)
	}
}

func TestOCIPushToLocalRegistry(t *testing.T) {
	// No credentials from the developer's Docker config.
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	pull := func(stdout string) []byte {
		t.Helper()
		_, after, ok := strings.Cut(stdout, "pinned reference: ")
		if !ok {
			t.Fatalf("push printed no pinned reference:\n%s", stdout)
		}
		ref, err := name.ParseReference(strings.TrimSpace(after), name.Insecure)
		if err != nil {
			t.Fatalf("pinned reference %q: %v", after, err)
		}
		if _, ok := ref.(name.Digest); !ok {
			t.Fatalf("pinned reference %q is not by digest", ref)
		}
		img, err := remote.Image(ref)
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		got, err := oci.ExtractPlugin(img)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	// Straight from a module file.
	wasm, module := syntheticWasm(t, 5, 3000)
	stdout, err := runCLI(t, "oci", "push", "--insecure", "--wasm", wasm, host+"/kvroute/filter:v1")
	if err != nil {
		t.Fatal(err)
	}
	if got := pull(stdout); !bytes.Equal(got, module) {
		t.Fatal("the pulled plugin.wasm differs from the pushed module")
	}

	// From an archive written by `oci build`: the same image, by digest.
	wasm2, module2 := syntheticWasm(t, 6, 2000)
	archive := filepath.Join(t.TempDir(), "img.tar")
	if _, err := runCLI(t, "oci", "build", "--wasm", wasm2, "--out", archive); err != nil {
		t.Fatal(err)
	}
	built, err := oci.ReadArchive(archive)
	if err != nil {
		t.Fatal(err)
	}
	builtDigest, _ := built.Digest()
	stdout, err = runCLI(t, "oci", "push", "--insecure", "--archive", archive, host+"/kvroute/filter:v2")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, "@"+builtDigest.String()) {
		t.Errorf("pushed archive is not pinned at its own digest %s:\n%s", builtDigest, stdout)
	}
	if got := pull(stdout); !bytes.Equal(got, module2) {
		t.Fatal("the pulled plugin.wasm differs from the archived module")
	}

	// Bad input.
	if _, err := runCLI(t, "oci", "push", "--insecure", "--archive", archive, "--wasm", wasm, host+"/kvroute/filter:v3"); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("--wasm with --archive: error %v", err)
	}
	missing := filepath.Join(t.TempDir(), "missing.wasm")
	if _, err := runCLI(t, "oci", "push", "--insecure", "--wasm", missing, host+"/kvroute/filter:v3"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing --wasm file: error %v", err)
	}
	if _, err := runCLI(t, "oci", "push", "--insecure", "--wasm", wasm, "not a ref!"); err == nil || !strings.Contains(err.Error(), "not an image reference") {
		t.Errorf("malformed reference: error %v", err)
	}
	v3, _ := name.ParseReference(host+"/kvroute/filter:v3", name.Insecure)
	if _, err := remote.Image(v3); err == nil {
		t.Error("a failed push still created filter:v3")
	}
}

// TestOCIPushesTheMetricsImageIndex: the archive make image writes (an
// image index, one image per platform) goes up as that index, pinned at its
// own digest.
func TestOCIPushesTheMetricsImageIndex(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	idx, err := oci.BinaryIndex([]oci.Binary{
		{Platform: v1.Platform{OS: "linux", Architecture: "amd64"}, Data: []byte("amd64 binary")},
		{Platform: v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}, Data: []byte("arm64 binary")},
	}, oci.BinaryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "kvroute-metrics-oci.tar")
	if err := oci.WriteIndexArchiveFile(archive, idx, "kvroute-metrics:v0"); err != nil {
		t.Fatal(err)
	}
	want, _ := idx.Digest()
	stdout, err := runCLI(t, "oci", "push", "--insecure", "--archive", archive, host+"/kvroute-metrics:v0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, "@"+want.String()) || !strings.Contains(stdout, "linux/amd64, linux/arm64/v8") {
		t.Errorf("push output does not pin the index %s for both platforms:\n%s", want, stdout)
	}
	ref, _ := name.ParseReference(host+"/kvroute-metrics:v0", name.Insecure)
	pulled, err := remote.Index(ref)
	if err != nil {
		t.Fatalf("the registry holds no index at the tag: %v", err)
	}
	if got, _ := pulled.Digest(); got != want {
		t.Errorf("pulled index %s, pushed %s", got, want)
	}
}
