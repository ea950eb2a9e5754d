package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kvroute/kvroute/internal/testenv"
)

// syntheticModule is a valid Wasm header followed by bytes that differ per
// seed, so the tests do not need `make wasm`.
func syntheticModule(seed byte, n int) []byte {
	m := append([]byte(nil), wasmMagic...)
	for i := 0; i < n; i++ {
		m = append(m, byte(i*31)^seed)
	}
	return m
}

// checkCompat asserts what Istio and Envoy Gateway rely on.
func checkCompat(t *testing.T, img v1.Image, want []byte) {
	t.Helper()
	mt, err := img.MediaType()
	if err != nil || mt != types.OCIManifestSchema1 {
		t.Fatalf("manifest media type = %q, %v; want %s", mt, err, types.OCIManifestSchema1)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("config media type = %s, want %s", m.Config.MediaType, types.OCIConfigJSON)
	}
	if len(m.Layers) != 1 {
		t.Fatalf("layers = %d, want exactly 1", len(m.Layers))
	}
	if m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("layer media type = %s, want %s", m.Layers[0].MediaType, types.OCILayer)
	}
	if got := m.Annotations[VariantAnnotation]; got != VariantCompat {
		t.Errorf("annotation %s = %q, want %q", VariantAnnotation, got, VariantCompat)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "wasip1" || cfg.Architecture != "wasm" {
		t.Errorf("platform = %s/%s, want wasip1/wasm", cfg.OS, cfg.Architecture)
	}
	// The layer holds exactly one entry, plugin.wasm at the root.
	l, _ := img.LayerByDigest(m.Layers[0].Digest)
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if len(names) != 1 || names[0] != PluginFileName {
		t.Errorf("layer entries = %v, want [%s]", names, PluginFileName)
	}
	got, err := ExtractPlugin(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("extracted %s differs from the input (%d vs %d bytes)", PluginFileName, len(got), len(want))
	}
}

func TestBuildArchiveRoundTrip(t *testing.T) {
	module := syntheticModule(7, 200_000)
	img, back, out := roundTrip(t, module, Options{Annotations: map[string]string{"org.opencontainers.image.revision": "abc123"}})

	d1, _ := img.Digest()
	d2, _ := back.Digest()
	if d1 != d2 {
		t.Errorf("digest changed across the archive: %s then %s", d1, d2)
	}
	m, _ := back.Manifest()
	if m.Annotations["org.opencontainers.image.revision"] != "abc123" {
		t.Errorf("extra annotation lost: %v", m.Annotations)
	}

	// The archive is an OCI layout: oci-layout, index.json naming the ref.
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		var b bytes.Buffer
		b.ReadFrom(tr)
		files[h.Name] = b.Bytes()
	}
	if _, ok := files["oci-layout"]; !ok {
		t.Errorf("archive has no oci-layout file: %v", keys(files))
	}
	var index v1.IndexManifest
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations[RefNameAnnotation] != "kvroute:test" || index.Manifests[0].Digest != d1 {
		t.Errorf("index.json = %+v", index.Manifests)
	}
}

func keys(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func TestBuildIsReproducible(t *testing.T) {
	a, _ := Build(syntheticModule(1, 5000), Options{})
	b, _ := Build(syntheticModule(1, 5000), Options{})
	c, _ := Build(syntheticModule(2, 5000), Options{})
	da, _ := a.Digest()
	db, _ := b.Digest()
	dc, _ := c.Digest()
	if da != db {
		t.Errorf("same module, different digests: %s %s", da, db)
	}
	if da == dc {
		t.Errorf("different modules, same digest %s", da)
	}
	var x, y bytes.Buffer
	if err := WriteArchive(&x, a, "r"); err != nil {
		t.Fatal(err)
	}
	if err := WriteArchive(&y, b, "r"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x.Bytes(), y.Bytes()) {
		t.Error("same image, different archive bytes")
	}
}

func TestBuildRejectsNonWasm(t *testing.T) {
	for name, in := range map[string][]byte{
		"empty":     nil,
		"text":      []byte("#!/bin/sh\necho not wasm\n"),
		"short":     []byte{0, 'a', 's'},
		"version 2": {0, 'a', 's', 'm', 2, 0, 0, 0},
	} {
		if _, err := Build(in, Options{}); err == nil {
			t.Errorf("%s: Build accepted a non-Wasm input", name)
		} else if !strings.Contains(err.Error(), "Wasm") {
			t.Errorf("%s: error does not say what is wrong: %v", name, err)
		}
	}
}

func TestExtractPluginRejectsWrongImages(t *testing.T) {
	noLayers := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	if _, err := ExtractPlugin(noLayers); err == nil || !strings.Contains(err.Error(), "no layers") {
		t.Errorf("image without layers: %v", err)
	}
	rawWasm, err := mutate.Append(noLayers, mutate.Addendum{
		Layer: static.NewLayer(syntheticModule(3, 10), "application/vnd.module.wasm.content.layer.v1+wasm"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ExtractPlugin(rawWasm); err == nil || !strings.Contains(err.Error(), "media type") {
		t.Errorf("oci-variant layer: %v", err)
	}
	// A compat layer that holds some other file.
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "filter.wasm", Mode: 0o444, Size: 8, Typeflag: tar.TypeReg})
	tw.Write(wasmMagic)
	tw.Close()
	gz.Close()
	other, err := tarball.LayerFromReader(bytes.NewReader(buf.Bytes()), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	wrongName, err := mutate.Append(noLayers, mutate.Addendum{Layer: other, MediaType: types.OCILayer})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ExtractPlugin(wrongName); err == nil || !strings.Contains(err.Error(), "plugin.wasm not found") {
		t.Errorf("layer without plugin.wasm: %v", err)
	}
}

func TestReadArchiveRejectsTraversal(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "../evil", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	p := filepath.Join(t.TempDir(), "bad.tar")
	os.WriteFile(p, buf.Bytes(), 0o644)
	if _, err := ReadArchive(p); err == nil || !strings.Contains(err.Error(), "escapes") {
		t.Errorf("ReadArchive(../evil) = %v, want an escape error", err)
	}
	if _, err := ReadArchive(filepath.Join(t.TempDir(), "missing.tar")); err == nil {
		t.Error("ReadArchive of a missing file succeeded")
	}
}

// TestPushToLocalRegistry pushes to an in-process registry on loopback and
// pulls the image back the way a consumer would.
func TestPushToLocalRegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	module := syntheticModule(9, 4096)
	img, err := Build(module, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ref := host + "/kvroute/filter:v0.0.1"
	d, err := Push(context.Background(), ref, img, PushOptions{Insecure: true, Keychain: authn.NewMultiKeychain()})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if d.DigestStr() != want.String() {
		t.Errorf("Push returned %s, image digest is %s", d, want)
	}
	r, _ := name.ParseReference(ref, name.Insecure)
	pulled, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	checkCompat(t, pulled, module)

	if _, err := Push(context.Background(), "not a ref!", img, PushOptions{}); err == nil {
		t.Error("Push accepted a malformed reference")
	}
}

// TestRealModuleRoundTrip packages the module `make wasm` built (`make
// test` builds it first) and reads it back byte for byte.
func TestRealModuleRoundTrip(t *testing.T) {
	roundTrip(t, testenv.Module(t), Options{})
}

// roundTrip builds module's image, writes it to an archive file (out) and
// reads it back, checking the image read back carries module as the
// compatible layout requires.
func roundTrip(t *testing.T, module []byte, opts Options) (img, back v1.Image, out string) {
	t.Helper()
	img, err := Build(module, opts)
	if err != nil {
		t.Fatal(err)
	}
	out = filepath.Join(t.TempDir(), "kvroute-oci.tar")
	if err := WriteArchiveFile(out, img, "kvroute:test"); err != nil {
		t.Fatal(err)
	}
	if back, err = ReadArchive(out); err != nil {
		t.Fatal(err)
	}
	checkCompat(t, back, module)
	return img, back, out
}
