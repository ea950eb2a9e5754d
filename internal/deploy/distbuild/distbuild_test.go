package main

import (
	"archive/tar"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"sigs.k8s.io/yaml"

	kvbuild "github.com/kvroute/kvroute/internal/buildinfo"
	"github.com/kvroute/kvroute/internal/deploy/oci"
)

// notInTheService are modules the metrics-only binary must not link: the
// plotting, Wasm runtime, OpenAI client, OCI and manifest-validation code
// of the other commands (a new command file needs the !metricsonly
// constraint, or this test names what it dragged in).
var notInTheService = []string{
	"gonum.org/v1/plot",
	"github.com/tetratelabs/wazero",
	"github.com/openai/openai-go",
	"github.com/google/go-containerregistry",
	"github.com/envoyproxy/gateway",
	"github.com/envoyproxy/go-control-plane",
	"istio.io/api",
	"helm.sh/helm",
}

// TestMetricsImageForThisMachine builds the image for the host's platform
// (one cross-compile of the service; make image adds the others) and
// checks what a cluster would run: a static binary for this machine,
// carrying the release version, with only metrics and version in it,
// started as a non-root user.
func TestMetricsImageForThisMachine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the service binary")
	}
	ctx := context.Background()
	root, err := repoRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	host := platform{"linux", runtime.GOARCH}
	if runtime.GOOS != "linux" {
		t.Skipf("SKIPPED: the image's binary runs on linux, not %s", runtime.GOOS)
	}
	out := filepath.Join(t.TempDir(), ImageArchive)
	res, err := buildImage(ctx, root, []platform{host}, out)
	if err != nil {
		t.Fatal(err)
	}
	a, err := oci.ReadArchiveArtifact(out)
	if err != nil {
		t.Fatal(err)
	}
	if a.Index == nil {
		t.Fatal("the archive holds no image index")
	}
	if d, _ := a.Index.Digest(); d != res.Digest {
		t.Errorf("archive index %s, built %s", d, res.Digest)
	}
	im, _ := a.Index.IndexManifest()
	if len(im.Manifests) != 1 || im.Manifests[0].Platform.String() != host.String() {
		t.Fatalf("index manifests %+v, want one for %s", im.Manifests, host)
	}
	img, err := a.Index.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := img.ConfigFile()
	if cfg.Config.User != "65532:65532" || strings.Join(cfg.Config.Entrypoint, " ") != Entrypoint {
		t.Errorf("user %q entrypoint %q", cfg.Config.User, cfg.Config.Entrypoint)
	}

	// The binary in the image, run here.
	bin := filepath.Join(t.TempDir(), "kvroute")
	extractFile(t, img, strings.TrimPrefix(Entrypoint, "/"), bin)
	if err := checkStatic(bin, host); err != nil {
		t.Fatal(err)
	}
	versionOut, err := exec.Command(bin, "version", "--json").Output()
	if err != nil {
		t.Fatalf("kvroute version: %v", err)
	}
	var v struct {
		Version, Revision, Go string
	}
	if err := json.Unmarshal(versionOut, &v); err != nil {
		t.Fatalf("version --json: %v: %s", err, versionOut)
	}
	src := kvbuild.Source(ctx, root)
	if v.Version != kvbuild.Release || v.Revision != src.Revision || v.Go != src.Go {
		t.Errorf("the image's binary reports %+v, want %s at revision %q built by %s", v, kvbuild.Release, src.Revision, src.Go)
	}
	help, err := exec.Command(bin, "--help").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"metrics", "version"} {
		if !strings.Contains(string(help), "  "+want+" ") {
			t.Errorf("the service binary lacks %s:\n%s", want, help)
		}
	}
	for _, gone := range []string{"bench", "demo", "sim", "oci", "validate"} {
		if strings.Contains(string(help), "  "+gone+" ") {
			t.Errorf("the service binary carries the %s command:\n%s", gone, help)
		}
	}
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range bi.Deps {
		for _, bad := range notInTheService {
			if strings.HasPrefix(dep.Path, bad) {
				t.Errorf("the service binary links %s", dep.Path)
			}
		}
	}
}

// extractFile writes the file name of img's flattened file system to dst.
func extractFile(t *testing.T, img v1.Image, name, dst string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("%s is not in the image", name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != name {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
		return
	}
}

func TestCheckStaticRefusesWhatTheImageCannotRun(t *testing.T) {
	self, err := os.Executable() // a test binary: dynamically linked when cgo is on
	if err != nil {
		t.Fatal(err)
	}
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	if err := checkStatic(self, platform{"linux", other}); err == nil || !strings.Contains(err.Error(), "not") {
		t.Errorf("a binary for another machine passed: %v", err)
	}
	notELF := filepath.Join(t.TempDir(), "x")
	os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755)
	if err := checkStatic(notELF, platform{"linux", runtime.GOARCH}); err == nil || !strings.Contains(err.Error(), "not an ELF") {
		t.Errorf("a script passed: %v", err)
	}
	for _, dyn := range []string{"/bin/sh", "/usr/bin/env"} {
		if _, err := os.Stat(dyn); err != nil {
			continue
		}
		if err := checkStatic(dyn, platform{"linux", runtime.GOARCH}); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
			t.Errorf("%s (dynamically linked on this system) passed: %v", dyn, err)
		}
		break
	}
}

func TestParsePlatforms(t *testing.T) {
	ps, err := parsePlatforms("linux/amd64, linux/arm64")
	if err != nil || len(ps) != 2 || ps[1].arch != "arm64" {
		t.Fatalf("%v %v", ps, err)
	}
	for _, bad := range []string{"", "darwin/arm64", "linux", "linux/amd64,linux/amd64", "linux/wasm"} {
		if _, err := parsePlatforms(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestReleaseSums: SHA256SUMS lists every other file of the folder in
// the format sha256sum -c checks.
func TestReleaseSums(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "b.wasm"), []byte("module"), 0o644)
	os.WriteFile(filepath.Join(dir, "a.tar"), []byte("archive"), 0o644)
	os.WriteFile(filepath.Join(dir, SumsFile), []byte("stale"), 0o644)
	text, err := writeSums(dir)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) != 2 || !strings.HasSuffix(lines[0], "  a.tar") || !strings.HasSuffix(lines[1], "  b.wasm") {
		t.Fatalf("SHA256SUMS:\n%s", text)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, SumsFile)); string(got) != text {
		t.Errorf("file and returned text differ")
	}
	if _, err := exec.LookPath("sha256sum"); err == nil {
		cmd := exec.Command("sha256sum", "-c", SumsFile)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("sha256sum -c: %v\n%s", err, out)
		}
		os.WriteFile(filepath.Join(dir, "a.tar"), []byte("tampered"), 0o644)
		cmd = exec.Command("sha256sum", "-c", SumsFile)
		cmd.Dir = dir
		if err := cmd.Run(); err == nil {
			t.Error("sha256sum -c accepts a changed file: the sums do not cover it")
		}
	}
}

// TestManifestNamesTheBuiltImage: the Kubernetes manifest pulls the image
// make image builds, runs it as the image's user, and passes arguments the
// image's entrypoint takes (kvroute metrics ...).
func TestManifestNamesTheBuiltImage(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "envoy", "kubernetes", "metrics.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, doc := range strings.Split(string(data), "\n---") {
		var d struct {
			Kind string
			Spec struct {
				Template struct {
					Spec struct {
						SecurityContext struct{ RunAsUser int64 } `json:"securityContext"`
						Containers      []struct {
							Image string
							Args  []string
						}
					}
				}
			}
		}
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil || d.Kind != "Deployment" {
			continue
		}
		found = true
		c := d.Spec.Template.Spec.Containers[0]
		repo, _, _ := strings.Cut(c.Image, ":")
		if filepath.Base(repo) != ImageName {
			t.Errorf("the Deployment pulls %s; make image builds %s", c.Image, ImageName)
		}
		if d.Spec.Template.Spec.SecurityContext.RunAsUser != oci.NonRootUID {
			t.Errorf("runAsUser %d, the image's user is %d", d.Spec.Template.Spec.SecurityContext.RunAsUser, oci.NonRootUID)
		}
		if len(c.Args) == 0 || c.Args[0] != "metrics" {
			t.Errorf("args %q do not start with the metrics subcommand the entrypoint %s takes", c.Args, Entrypoint)
		}
	}
	if !found {
		t.Fatal("no Deployment in envoy/kubernetes/metrics.yaml")
	}
}
