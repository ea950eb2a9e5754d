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
