package oci

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// PushOptions tune Push.
type PushOptions struct {
	// Insecure allows plain HTTP and unverified TLS (a local registry).
	Insecure bool
	// Keychain resolves credentials; nil means the Docker config
	// (~/.docker/config.json and credential helpers), as docker push uses.
	Keychain authn.Keychain
}

// Pushable is an image (v1.Image) or an image index (v1.ImageIndex).
type Pushable interface {
	remote.Taggable
	Digest() (v1.Hash, error)
}

// Push uploads img, an image or an image index, to ref
// (registry/repository:tag or @digest) and returns the reference by digest,
// which is what manifests should pin.
func Push(ctx context.Context, ref string, img Pushable, opts PushOptions) (name.Digest, error) {
	var nameOpts []name.Option
	if opts.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nameOpts...)
	if err != nil {
		return name.Digest{}, fmt.Errorf("oci: %q is not an image reference (want registry/repository:tag): %w", ref, err)
	}
	kc := opts.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	if err := remote.Push(r, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(kc)); err != nil {
		return name.Digest{}, fmt.Errorf("oci: push %s: %w", r, err)
	}
	d, err := img.Digest()
	if err != nil {
		return name.Digest{}, err
	}
	return r.Context().Digest(d.String()), nil
}
