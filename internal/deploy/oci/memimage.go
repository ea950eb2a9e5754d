package oci

import (
	"bytes"
	"fmt"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// memImage is an image whose manifest, config and layer blobs are held in
// memory, byte for byte as they were read, so it outlives the files it came
// from and keeps the original digests.
type memImage struct {
	mediaType types.MediaType
	manifest  []byte
	config    []byte
	blobs     map[v1.Hash]memBlob
}

type memBlob struct {
	data      []byte
	digest    v1.Hash
	mediaType types.MediaType
}

func (m *memImage) MediaType() (types.MediaType, error) { return m.mediaType, nil }
func (m *memImage) RawManifest() ([]byte, error)        { return m.manifest, nil }
func (m *memImage) RawConfigFile() ([]byte, error)      { return m.config, nil }

func (m *memImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	b, ok := m.blobs[h]
	if !ok {
		return nil, fmt.Errorf("oci: no layer with digest %s", h)
	}
	return b, nil
}

func (b memBlob) Digest() (v1.Hash, error)            { return b.digest, nil }
func (b memBlob) Size() (int64, error)                { return int64(len(b.data)), nil }
func (b memBlob) MediaType() (types.MediaType, error) { return b.mediaType, nil }
func (b memBlob) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b.data)), nil
}

// materialize copies img into memory, verifying each layer's digest.
func materialize(img v1.Image) (v1.Image, error) {
	mt, err := img.MediaType()
	if err != nil {
		return nil, fmt.Errorf("oci: read media type: %w", err)
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("oci: read manifest: %w", err)
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("oci: read config: %w", err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("oci: parse manifest: %w", err)
	}
	mem := &memImage{mediaType: mt, manifest: manifest, config: config, blobs: map[v1.Hash]memBlob{}}
	for _, desc := range m.Layers {
		l, err := img.LayerByDigest(desc.Digest)
		if err != nil {
			return nil, fmt.Errorf("oci: layer %s: %w", desc.Digest, err)
		}
		rc, err := l.Compressed()
		if err != nil {
			return nil, fmt.Errorf("oci: layer %s: %w", desc.Digest, err)
		}
		data, err := io.ReadAll(io.LimitReader(rc, maxArchiveFile))
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("oci: layer %s: %w", desc.Digest, err)
		}
		got, _, err := v1.SHA256(bytes.NewReader(data))
		if err != nil {
			return nil, err
		}
		if got != desc.Digest {
			return nil, fmt.Errorf("oci: layer digest mismatch: manifest says %s, blob is %s", desc.Digest, got)
		}
		mem.blobs[desc.Digest] = memBlob{data: data, digest: desc.Digest, mediaType: desc.MediaType}
	}
	return partial.CompressedToImage(mem)
}

// memIndex is an image index held in memory with its manifest byte for
// byte, so its digest is the one that was read; its images are memImages.
type memIndex struct {
	mediaType types.MediaType
	manifest  []byte
	images    map[v1.Hash]v1.Image
}

func (m *memIndex) MediaType() (types.MediaType, error) { return m.mediaType, nil }
func (m *memIndex) RawManifest() ([]byte, error)        { return m.manifest, nil }
func (m *memIndex) Size() (int64, error)                { return int64(len(m.manifest)), nil }
func (m *memIndex) Digest() (v1.Hash, error) {
	h, _, err := v1.SHA256(bytes.NewReader(m.manifest))
	return h, err
}
func (m *memIndex) IndexManifest() (*v1.IndexManifest, error) {
	return v1.ParseIndexManifest(bytes.NewReader(m.manifest))
}
func (m *memIndex) Image(h v1.Hash) (v1.Image, error) {
	img, ok := m.images[h]
	if !ok {
		return nil, fmt.Errorf("oci: no image with digest %s in the index", h)
	}
	return img, nil
}
func (m *memIndex) ImageIndex(h v1.Hash) (v1.ImageIndex, error) {
	return nil, fmt.Errorf("oci: nested index %s: only indexes of images are read", h)
}

// materializeIndex copies an index of images into memory.
func materializeIndex(idx v1.ImageIndex) (v1.ImageIndex, error) {
	mt, err := idx.MediaType()
	if err != nil {
		return nil, fmt.Errorf("oci: read index media type: %w", err)
	}
	raw, err := idx.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("oci: read index: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("oci: parse index: %w", err)
	}
	mem := &memIndex{mediaType: mt, manifest: raw, images: map[v1.Hash]v1.Image{}}
	for _, d := range im.Manifests {
		if !d.MediaType.IsImage() {
			return nil, fmt.Errorf("oci: index entry %s is %s; only images are read", d.Digest, d.MediaType)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("oci: image %s: %w", d.Digest, err)
		}
		if mem.images[d.Digest], err = materialize(img); err != nil {
			return nil, err
		}
	}
	return mem, nil
}
