package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// fakeBinaries stands in for the cross-compiled service: the assembly does
// not look inside the binary (internal/deploy/distbuild tests a real one).
func fakeBinaries() []Binary {
	return []Binary{
		{Platform: v1.Platform{OS: "linux", Architecture: "amd64"}, Data: bytes.Repeat([]byte("amd64-binary "), 500)},
		{Platform: v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}, Data: bytes.Repeat([]byte("arm64-binary "), 700)},
	}
}

// imageFiles flattens img and returns its files (regular files and
// folders) by path, with their headers.
func imageFiles(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, data
		}
		if err != nil {
			t.Fatal(err)
		}
		name := "/" + strings.TrimSuffix(h.Name, "/")
		hdrs[name] = h
		data[name], _ = io.ReadAll(tr)
	}
}

func TestBinaryIndexIsARunnableNonRootImagePerPlatform(t *testing.T) {
	bins := fakeBinaries()
	anns := map[string]string{VersionAnnotation: "v9.9.9"}
	idx, err := BinaryIndex(bins, BinaryOptions{Path: "/kvroute", Annotations: anns})
	if err != nil {
		t.Fatal(err)
	}
	if mt, _ := idx.MediaType(); mt != types.OCIImageIndex {
		t.Errorf("index media type %s, want %s", mt, types.OCIImageIndex)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != len(bins) || im.Annotations[VersionAnnotation] != "v9.9.9" {
		t.Fatalf("index: %d manifests, annotations %v", len(im.Manifests), im.Annotations)
	}
	for i, desc := range im.Manifests {
		want := bins[i]
		if desc.Platform == nil || !desc.Platform.Equals(want.Platform) {
			t.Errorf("manifest %d platform %v, want %v", i, desc.Platform, want.Platform)
		}
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.OS != want.Platform.OS || cfg.Architecture != want.Platform.Architecture || cfg.Variant != want.Platform.Variant {
			t.Errorf("%s: config platform %s/%s/%s", want.Platform, cfg.OS, cfg.Architecture, cfg.Variant)
		}
		if cfg.Config.User != "65532:65532" {
			t.Errorf("%s: user %q, want the numeric non-root 65532:65532 (runAsNonRoot needs a number)", want.Platform, cfg.Config.User)
		}
		if len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/kvroute" || len(cfg.Config.Cmd) != 0 {
			t.Errorf("%s: entrypoint %q cmd %q, want [/kvroute] and no cmd (the manifest's args follow it)", want.Platform, cfg.Config.Entrypoint, cfg.Config.Cmd)
		}
		layers, _ := img.Layers()
		if len(layers) != 2 {
			t.Errorf("%s: %d layers, want base + binary", want.Platform, len(layers))
		}
		hdrs, data := imageFiles(t, img)
		bin := hdrs["/kvroute"]
		if bin == nil || !bytes.Equal(data["/kvroute"], want.Data) {
			t.Fatalf("%s: /kvroute missing or not this platform's binary", want.Platform)
		}
		if bin.Mode&0o111 != 0o111 || bin.Uid != 0 {
			t.Errorf("%s: /kvroute mode %o uid %d, want executable by all and owned by root", want.Platform, bin.Mode, bin.Uid)
		}
		if !strings.Contains(string(data["/etc/passwd"]), "nonroot:x:65532:65532:") {
			t.Errorf("%s: /etc/passwd lacks the nonroot user:\n%s", want.Platform, data["/etc/passwd"])
		}
		if h := hdrs["/home/nonroot"]; h == nil || h.Uid != 65532 || h.Typeflag != tar.TypeDir {
			t.Errorf("%s: /home/nonroot is not a folder owned by 65532: %+v", want.Platform, h)
		}
		if h := hdrs["/tmp"]; h == nil || h.Mode&0o1777 != 0o1777 {
			t.Errorf("%s: /tmp is not world-writable and sticky: %+v", want.Platform, h)
		}
		if len(hdrs) != 7 {
			t.Errorf("%s: %d entries, want only the base (6) and the binary: %v", want.Platform, len(hdrs), keys(data))
		}
	}

	again, err := BinaryIndex(fakeBinaries(), BinaryOptions{Path: "/kvroute", Annotations: anns})
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := idx.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("equal binaries gave digests %s and %s: the image is not reproducible", d1, d2)
	}
}

func TestBinaryIndexBadInput(t *testing.T) {
	amd := fakeBinaries()[0]
	for want, bins := range map[string][]Binary{
		"no binaries":           nil,
		"two binaries for":      {amd, amd},
		"is empty":              {{Platform: amd.Platform}},
		"without an OS and arc": {{Data: []byte("x")}},
	} {
		if _, err := BinaryIndex(bins, BinaryOptions{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v", want, err)
		}
	}
	if _, err := BinaryIndex([]Binary{amd}, BinaryOptions{Path: "kvroute"}); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Errorf("relative path: error %v", err)
	}
}

// TestBinaryIndexArchiveRoundTripAndPush: the index written as an
// oci-archive reads back with the same digest, pushes to a registry and
// pulls back with both platforms.
func TestBinaryIndexArchiveRoundTripAndPush(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	idx, err := BinaryIndex(fakeBinaries(), BinaryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := idx.Digest()
	path := filepath.Join(t.TempDir(), "metrics-oci.tar")
	if err := WriteIndexArchiveFile(path, idx, "kvroute-metrics:v0"); err != nil {
		t.Fatal(err)
	}
	a, err := ReadArchiveArtifact(path)
	if err != nil {
		t.Fatal(err)
	}
	if a.Index == nil || a.Image != nil {
		t.Fatalf("archive read as %+v, want an index", a)
	}
	if got, _ := a.Index.Digest(); got != want {
		t.Fatalf("archive index digest %s, want %s", got, want)
	}
	if _, err := ReadArchive(path); err == nil || !strings.Contains(err.Error(), "index") {
		t.Errorf("ReadArchive of an index archive: %v, want an error naming the index", err)
	}

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/kvroute-metrics:v0"
	pinned, err := Push(context.Background(), ref, a.Index, PushOptions{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	if pinned.DigestStr() != want.String() {
		t.Errorf("pinned %s, want the index digest %s", pinned, want)
	}
	r, _ := name.ParseReference(ref, name.Insecure)
	pulled, err := remote.Index(r)
	if err != nil {
		t.Fatal(err)
	}
	pm, _ := pulled.IndexManifest()
	var plats []string
	for _, m := range pm.Manifests {
		plats = append(plats, m.Platform.String())
		img, err := pulled.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if _, data := imageFiles(t, img); len(data["/kvroute"]) == 0 {
			t.Errorf("%s: pulled image has no /kvroute", m.Platform)
		}
	}
	if strings.Join(plats, ",") != "linux/amd64,linux/arm64/v8" {
		t.Errorf("pulled platforms %v", plats)
	}
}
