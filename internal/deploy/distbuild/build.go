package main

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kvroute/kvroute/internal/buildinfo"
	"github.com/kvroute/kvroute/internal/deploy/oci"
)

const (
	// ImageName is the metrics service image's repository name, as the
	// Kubernetes manifest (envoy/kubernetes/metrics.yaml) names it.
	ImageName = "kvroute-metrics"
	// ImageArchive is the file make image writes under dist/.
	ImageArchive = "kvroute-metrics-oci.tar"
	// Entrypoint is where the binary lies in the image.
	Entrypoint = "/kvroute"
	// metricsOnlyTag leaves every command but metrics and version out of
	// cmd/kvroute (see its package comment).
	metricsOnlyTag = "metricsonly"
	cliPackage     = "./cmd/kvroute"
	sourceURL      = "https://github.com/kvroute/kvroute"
)

// platform is one OS/ARCH target.
type platform struct{ os, arch string }

func (p platform) String() string { return p.os + "/" + p.arch }

// elfMachine is the ELF machine of each architecture the image supports.
var elfMachine = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "arm": elf.EM_ARM,
	"ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390, "riscv64": elf.EM_RISCV, "386": elf.EM_386,
}

func parsePlatforms(list string) ([]platform, error) {
	var out []platform
	seen := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		osName, arch, ok := strings.Cut(s, "/")
		if !ok || osName != "linux" || elfMachine[arch] == 0 {
			return nil, fmt.Errorf("platform %q: want linux/ARCH with ARCH one of amd64, arm64, arm, ppc64le, s390x, riscv64, 386", s)
		}
		if seen[s] {
			return nil, fmt.Errorf("platform %s given twice", s)
		}
		seen[s] = true
		out = append(out, platform{osName, arch})
	}
	if len(out) == 0 {
		return nil, errors.New("no platforms given")
	}
	return out, nil
}

func platformNames(ps []platform) []string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.String()
	}
	return names
}

// repoRoot is the directory of the main module's go.mod.
func repoRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run distbuild from inside the kvroute repository (no go.mod found)")
	}
	return filepath.Dir(gomod), nil
}

// buildBinary cross-compiles cmd/kvroute for p into out: static
// (CGO_ENABLED=0), stripped, reproducible (-trimpath), stamped with info.
func buildBinary(ctx context.Context, root string, p platform, tags string, info buildinfo.Info, out string) error {
	args := []string{"build", "-trimpath", "-ldflags", "-s -w " + info.LDFlags(), "-o", out}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, cliPackage)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.os, "GOARCH="+p.arch)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s: %w\n%s", p, err, strings.TrimSpace(stderr.String()))
	}
	return checkStatic(out, p)
}

// checkStatic refuses a binary that is not an ELF executable for p's
// machine or that needs a dynamic loader: the image has no libc, so such a
// binary would fail at exec with a puzzling "no such file or directory".
func checkStatic(path string, p platform) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s is not an ELF binary: %w", path, err)
	}
	defer f.Close()
	if want := elfMachine[p.arch]; f.Machine != want {
		return fmt.Errorf("%s is built for %s, not %s (%s)", path, f.Machine, want, p)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (it asks for a program interpreter); the image has no libc: build with CGO_ENABLED=0", path)
		}
	}
	return nil
}

// imageResult is what buildImage made.
type imageResult struct {
	Ref, Entrypoint string
	Digest          v1.Hash
}

// buildImage builds the metrics-only binary for every platform and writes
// the image index holding them to out.
func buildImage(ctx context.Context, root string, plats []platform, out string) (imageResult, error) {
	info := buildinfo.Source(ctx, root)
	tmp, err := os.MkdirTemp("", "kvroute-distbuild-")
	if err != nil {
		return imageResult{}, err
	}
	defer os.RemoveAll(tmp)
	var bins []oci.Binary
	for _, p := range plats {
		path := filepath.Join(tmp, p.os+"-"+p.arch, "kvroute")
		if err := buildBinary(ctx, root, p, metricsOnlyTag, info, path); err != nil {
			return imageResult{}, err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return imageResult{}, err
		}
		plat := v1.Platform{OS: p.os, Architecture: p.arch}
		if p.arch == "arm64" {
			plat.Variant = "v8" // what registries and runtimes expect for arm64
		}
		bins = append(bins, oci.Binary{Platform: plat, Data: data})
		fmt.Printf("distbuild: %s/%s binary: %.1f MB (metrics and version only)\n", p.os, p.arch, float64(len(data))/1e6)
	}
	anns := map[string]string{
		oci.TitleAnnotation:                    ImageName,
		oci.VersionAnnotation:                  info.Version,
		"org.opencontainers.image.source":      sourceURL,
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.description": "kvroute metrics: discovers LLM engines, scrapes their load and KV events, pushes the fleet state to kvroute gateways",
	}
	if info.Revision != "" {
		anns[oci.RevisionAnnotation] = info.Revision
	}
	idx, err := oci.BinaryIndex(bins, oci.BinaryOptions{Path: Entrypoint, Annotations: anns})
	if err != nil {
		return imageResult{}, err
	}
	if !filepath.IsAbs(out) {
		out = filepath.Join(root, out)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return imageResult{}, err
	}
	ref := ImageName + ":" + info.Version
	if err := oci.WriteIndexArchiveFile(out, idx, ref); err != nil {
		return imageResult{}, err
	}
	d, err := idx.Digest()
	return imageResult{Ref: ref, Entrypoint: Entrypoint, Digest: d}, err
}
