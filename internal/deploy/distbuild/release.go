package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kvroute/kvroute/internal/buildinfo"
)

// SumsFile is the checksum list a release carries.
const SumsFile = "SHA256SUMS"

// runRelease fills dir with the CLI binaries, the metrics image, copies of
// files, and SHA256SUMS. dir is emptied first, so it holds this release only.
func runRelease(ctx context.Context, plats []platform, dir string, files []string) error {
	root, err := repoRoot(ctx)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return errors.New("release: give the Wasm modules and archives to include (make release does)")
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("release: %w (make release builds every artefact first)", err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	info := buildinfo.Source(ctx, root)
	for _, p := range plats {
		out := filepath.Join(dir, "kvroute-"+p.os+"-"+p.arch)
		if err := buildBinary(ctx, root, p, "", info, out); err != nil {
			return err
		}
	}
	if _, err := buildImage(ctx, root, plats, filepath.Join(dir, ImageArchive)); err != nil {
		return err
	}
	for _, f := range files {
		if err := copyFile(f, filepath.Join(dir, filepath.Base(f))); err != nil {
			return err
		}
	}
	sums, err := writeSums(dir)
	if err != nil {
		return err
	}
	fmt.Printf("distbuild: release %s in %s:\n%s", info, dir, sums)
	if info.Modified {
		fmt.Println("distbuild: warning: built from a tree with uncommitted changes; the revision does not describe it")
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// writeSums writes SHA256SUMS over every other regular file in dir, sorted
// by name, one "HEX  NAME" line each (what `sha256sum -c SHA256SUMS` and
// `shasum -a 256 -c SHA256SUMS` read), and returns its text.
func writeSums(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != SumsFile {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			return "", err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%x  %s\n", h.Sum(nil), n)
	}
	return b.String(), os.WriteFile(filepath.Join(dir, SumsFile), []byte(b.String()), 0o644)
}
