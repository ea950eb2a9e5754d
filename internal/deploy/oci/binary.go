package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// This file builds the runnable image of a static Go binary (the metrics
// service), the way ko does and without a container engine: no base image
// to pull, one small layer standing in for a distroless base (the users and
// folders a non-root process expects) and one layer holding the binary, for
// each platform, tied together by an OCI image index. Like the Wasm image,
// it is reproducible: equal binaries give equal digests.

// NonRootUID is the user and group the image runs as: distroless's
// "nonroot", which Kubernetes' runAsNonRoot accepts because it is numeric.
const NonRootUID = 65532

// Binary is one platform's build of the program.
type Binary struct {
	Platform v1.Platform
	Data     []byte
}

// BinaryOptions describe the image around the binaries.
type BinaryOptions struct {
	// Path is where the binary lies in the image and the entrypoint
	// (default "/kvroute").
	Path string
	// Annotations go on the index and on every manifest (title, version,
	// revision, source, licenses).
	Annotations map[string]string
}

// BinaryIndex returns an OCI image index with one image per binary. Each
// image runs Path as NonRootUID with nothing else in it but /etc/passwd,
// /etc/group, /home/nonroot and /tmp.
func BinaryIndex(bins []Binary, opts BinaryOptions) (v1.ImageIndex, error) {
	if len(bins) == 0 {
		return nil, errors.New("oci: no binaries to package")
	}
	p := opts.Path
	if p == "" {
		p = "/kvroute"
	}
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return nil, fmt.Errorf("oci: binary path %q must be a clean absolute file path", p)
	}
	base, err := gzipLayer(baseFiles())
	if err != nil {
		return nil, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	for _, b := range bins {
		plat := b.Platform.String()
		if b.Platform.OS == "" || b.Platform.Architecture == "" {
			return nil, fmt.Errorf("oci: binary without an OS and architecture (%q)", plat)
		}
		if seen[plat] {
			return nil, fmt.Errorf("oci: two binaries for %s", plat)
		}
		seen[plat] = true
		if len(b.Data) == 0 {
			return nil, fmt.Errorf("oci: the %s binary is empty", plat)
		}
		bin, err := gzipLayer([]layerFile{{name: strings.TrimPrefix(p, "/"), mode: 0o755, data: b.Data}})
		if err != nil {
			return nil, err
		}
		img, err := binaryImage(b.Platform, p, base, bin, opts.Annotations)
		if err != nil {
			return nil, fmt.Errorf("oci: %s image: %w", plat, err)
		}
		plat2 := b.Platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{MediaType: types.OCIManifestSchema1, Platform: &plat2},
		})
	}
	return mutate.Annotations(idx, opts.Annotations).(v1.ImageIndex), nil
}

func binaryImage(plat v1.Platform, entry string, base, bin v1.Layer, anns map[string]string) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "kvroute base: /etc/passwd, /etc/group, /home/nonroot, /tmp"}},
		mutate.Addendum{Layer: bin, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "static binary " + entry}},
	)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Variant, cfg.OSVersion = plat.OS, plat.Architecture, plat.Variant, plat.OSVersion
	cfg.Created = v1.Time{Time: epoch}
	uid := fmt.Sprint(NonRootUID)
	cfg.Config = v1.Config{
		Entrypoint: []string{entry},
		User:       uid + ":" + uid,
		WorkingDir: "/home/nonroot",
		Env:        []string{"PATH=" + path.Dir(entry), "HOME=/home/nonroot"},
		Labels:     anns,
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return nil, err
	}
	return mutate.Annotations(img, anns).(v1.Image), nil
}

// layerFile is one entry of a layer; a nil data with a dir mode is a folder.
type layerFile struct {
	name     string
	mode     int64
	uid, gid int
	dir      bool
	data     []byte
}

// baseFiles is what distroless's static image offers a non-root Go binary,
// minus CA certificates (the binary carries Mozilla's roots as a fallback:
// golang.org/x/crypto/x509roots/fallback) and time zones (it logs in UTC).
func baseFiles() []layerFile {
	uid := NonRootUID
	return []layerFile{
		{name: "etc/", dir: true, mode: 0o755},
		{name: "etc/group", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:\nnobody:x:65534:\nnonroot:x:%d:\n", uid)},
		{name: "etc/passwd", mode: 0o644, data: fmt.Appendf(nil,
			"root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", uid, uid)},
		{name: "home/", dir: true, mode: 0o755},
		{name: "home/nonroot/", dir: true, mode: 0o700, uid: uid, gid: uid},
		{name: "tmp/", dir: true, mode: 0o1777},
	}
}

// gzipLayer packs files into a gzip tar layer with fixed times.
func gzipLayer(files []layerFile) (v1.Layer, error) {
	data, err := gzipTar(files, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// gzipTar returns files as a gzip-compressed tar with fixed times and
// owners, so its bytes depend only on the files (reproducible digests).
func gzipTar(files []layerFile, level int) ([]byte, error) {
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, level)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(gz)
	for _, f := range files {
		hdr := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.gid, ModTime: epoch, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: int64(len(f.data))}
		if f.dir {
			hdr.Typeflag, hdr.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("oci: write layer: %w", err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("oci: write layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("oci: write layer: %w", err)
	}
	if err := gz.Close(); err != nil {
		return nil, fmt.Errorf("oci: write layer: %w", err)
	}
	return buf.Bytes(), nil
}
