package oci

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// RefNameAnnotation is the index annotation naming an image in a layout.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// WriteArchive writes img as an OCI image layout packed in one tar (an
// oci-archive) to w. refName, when set, tags the image inside the layout
// (skopeo's oci-archive:FILE:REF). The go-containerregistry layout writer
// does the layout; this function only packs its directory with fixed
// timestamps so equal images give equal archives.
func WriteArchive(w io.Writer, img v1.Image, refName string) error {
	return writeLayoutArchive(w, refName, func(p layout.Path, opts []layout.Option) error { return p.AppendImage(img, opts...) })
}

// WriteIndexArchive is WriteArchive for an image index (one image per
// platform), as the metrics service image is.
func WriteIndexArchive(w io.Writer, idx v1.ImageIndex, refName string) error {
	return writeLayoutArchive(w, refName, func(p layout.Path, opts []layout.Option) error { return p.AppendIndex(idx, opts...) })
}

func writeLayoutArchive(w io.Writer, refName string, add func(layout.Path, []layout.Option) error) error {
	dir, err := os.MkdirTemp("", "kvroute-oci-layout-")
	if err != nil {
		return fmt.Errorf("oci: temp dir: %w", err)
	}
	defer os.RemoveAll(dir)

	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("oci: write layout: %w", err)
	}
	var opts []layout.Option
	if refName != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{RefNameAnnotation: refName}))
	}
	if err := add(p, opts); err != nil {
		return fmt.Errorf("oci: write image to layout: %w", err)
	}
	return tarDir(w, dir)
}

// WriteArchiveFile is WriteArchive to a file, written whole or not at all.
func WriteArchiveFile(name string, img v1.Image, refName string) error {
	return writeFileAtomic(name, func(w io.Writer) error { return WriteArchive(w, img, refName) })
}

// WriteIndexArchiveFile is WriteIndexArchive to a file, written whole or not at all.
func WriteIndexArchiveFile(name string, idx v1.ImageIndex, refName string) error {
	return writeFileAtomic(name, func(w io.Writer) error { return WriteIndexArchive(w, idx, refName) })
}

func writeFileAtomic(name string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), ".kvroute-oci-*.tar")
	if err != nil {
		return fmt.Errorf("oci: create %s: %w", name, err)
	}
	defer os.Remove(tmp.Name())
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("oci: write %s: %w", name, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("oci: write %s: %w", name, err)
	}
	return os.Rename(tmp.Name(), name)
}

// tarDir packs every regular file under dir, in name order.
func tarDir(w io.Writer, dir string) error {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("oci: walk layout: %w", err)
	}
	sort.Strings(files)
	tw := tar.NewWriter(w)
	for _, name := range files {
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			return fmt.Errorf("oci: read layout file: %w", err)
		}
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("oci: write archive: %w", err)
		}
		if _, err := tw.Write(data); err != nil {
			return fmt.Errorf("oci: write archive: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("oci: write archive: %w", err)
	}
	return nil
}

// maxArchiveFile bounds each file read back from an archive.
const maxArchiveFile = 512 << 20

// Artifact is what an archive holds: an image (the Wasm module's) or an
// image index (the metrics service's, one image per platform).
type Artifact struct {
	Image v1.Image
	Index v1.ImageIndex
}

// ReadArchive opens an oci-archive holding one image, written by
// WriteArchive (or by skopeo, podman).
func ReadArchive(name string) (v1.Image, error) {
	a, err := ReadArchiveArtifact(name)
	if err != nil {
		return nil, err
	}
	if a.Image == nil {
		return nil, fmt.Errorf("oci: %s holds a multi-platform image index, not a single image (is it the metrics service image?)", name)
	}
	return a.Image, nil
}

// ReadArchiveArtifact opens an oci-archive holding one image or one image
// index. The archive is unpacked into a temporary directory that is removed
// before returning, so the blobs are read into memory first (and their
// digests checked).
func ReadArchiveArtifact(name string) (Artifact, error) {
	f, err := os.Open(name)
	if err != nil {
		return Artifact{}, fmt.Errorf("oci: open archive: %w", err)
	}
	defer f.Close()

	dir, err := os.MkdirTemp("", "kvroute-oci-read-")
	if err != nil {
		return Artifact{}, fmt.Errorf("oci: temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := untar(f, dir); err != nil {
		return Artifact{}, fmt.Errorf("oci: %s: %w", name, err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return Artifact{}, fmt.Errorf("oci: %s is not an OCI image layout archive: %w", name, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return Artifact{}, fmt.Errorf("oci: read index: %w", err)
	}
	if len(im.Manifests) != 1 {
		return Artifact{}, fmt.Errorf("oci: %s holds %d manifests; expected one image or one index", name, len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.MediaType.IsIndex() {
		child, err := idx.ImageIndex(desc.Digest)
		if err != nil {
			return Artifact{}, fmt.Errorf("oci: read image index: %w", err)
		}
		mi, err := materializeIndex(child)
		return Artifact{Index: mi}, err
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		return Artifact{}, fmt.Errorf("oci: read image: %w", err)
	}
	mem, err := materialize(img)
	return Artifact{Image: mem}, err
}

// untar unpacks regular files from r under dir, refusing paths that escape it.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if hdr.Typeflag == tar.TypeDir {
			continue
		}
		if hdr.Typeflag != tar.TypeReg {
			return fmt.Errorf("unexpected entry %q of type %c", hdr.Name, hdr.Typeflag)
		}
		clean := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if clean == ".." || strings.HasPrefix(clean, "../") || path.IsAbs(clean) {
			return fmt.Errorf("entry %q escapes the archive", hdr.Name)
		}
		if hdr.Size > maxArchiveFile {
			return fmt.Errorf("entry %q is %d bytes, over the limit", hdr.Name, hdr.Size)
		}
		dst := filepath.Join(dir, filepath.FromSlash(clean))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		out, err := os.Create(dst)
		if err != nil {
			return err
		}
		_, cerr := io.Copy(out, io.LimitReader(tr, maxArchiveFile))
		if err := errors.Join(cerr, out.Close()); err != nil {
			return err
		}
	}
}
