package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/deploy/wasmbuild/abibridge"
)

// goCmd runs the go command in dir and returns its standard output. Errors
// carry the command's standard error, which is what the user needs to read.
func goCmd(ctx context.Context, dir string, env []string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// repoRoot is the directory of the main module's go.mod.
func repoRoot(ctx context.Context) (string, error) {
	out, err := goCmd(ctx, "", []string{"GOWORK=off"}, "env", "GOMOD")
	if err != nil {
		return "", err
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("run wasmbuild from inside the kvroute repository (no go.mod found)")
	}
	return filepath.Dir(gomod), nil
}

// copySDK copies the SDK module, unmodified, from the module cache into
// work/sdk and returns that directory. The copy is rebuilt on every run so it
// can never drift from the module cache; the go build cache keys on content,
// so this costs no rebuild.
func copySDK(ctx context.Context, root, work string) (string, error) {
	var mod struct {
		Path, Version, Dir string
	}
	out, err := goCmd(ctx, root, []string{"GOWORK=off"}, "list", "-m", "-json", abibridge.SDKModule)
	if err != nil {
		return "", fmt.Errorf("go.mod must require %s %s: %w", abibridge.SDKModule, abibridge.SDKVersion, err)
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		return "", fmt.Errorf("reading go list output: %w", err)
	}
	if mod.Version != abibridge.SDKVersion {
		return "", fmt.Errorf("go.mod requires %s %s, but the ABI bridge in internal/deploy/wasmbuild/abibridge is written for %s: keep the SDK at %s",
			abibridge.SDKModule, mod.Version, abibridge.SDKVersion, abibridge.SDKVersion)
	}
	if mod.Dir == "" {
		out, err := goCmd(ctx, root, []string{"GOWORK=off"}, "mod", "download", "-json", abibridge.SDKModule+"@"+abibridge.SDKVersion)
		if err != nil {
			return "", err
		}
		if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
			return "", fmt.Errorf("go mod download did not report where %s is: %v", abibridge.SDKModule, err)
		}
	}
	dst := filepath.Join(work, "sdk")
	stamp := mod.Path + "@" + mod.Version + " from " + mod.Dir
	stampFile := filepath.Join(dst, ".kvroute-copied-from")
	if have, err := os.ReadFile(stampFile); err == nil && string(have) == stamp {
		return dst, nil // already copied; several builds may share it at once
	}
	// Copy into a private directory, then swap it in, so a concurrent build
	// never sees a half-written SDK.
	tmp, err := os.MkdirTemp(work, "sdk.tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	err = filepath.WalkDir(mod.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		relPath, err := filepath.Rel(mod.Dir, path)
		if err != nil {
			return err
		}
		target := filepath.Join(tmp, relPath)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
	if err != nil {
		return "", fmt.Errorf("copying %s from the module cache: %w", abibridge.SDKModule, err)
	}
	if err := os.WriteFile(filepath.Join(tmp, ".kvroute-copied-from"), []byte(stamp), 0o644); err != nil {
		return "", err
	}
	if err := os.RemoveAll(dst); err != nil {
		return "", fmt.Errorf("removing the previous SDK copy: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("installing the SDK copy: %w", err)
	}
	return dst, nil
}

// writeFileAtomic writes data to path through a temporary file and a rename:
// builds running at once (several engineers, or make wasm during go test)
// never read a half-written file.
func writeFileAtomic(path string, data []byte) error {
	if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, data) {
		return nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	return os.Rename(f.Name(), path)
}

// writeGoWork writes the build-only workspace: the repository plus a replace
// of the SDK by its copy, plus the extra replace lines given (pretty.go). The
// repository's go.mod and go.sum stay untouched.
func writeGoWork(work, sdkDir string, extra ...string) (string, error) {
	goVersion, err := mainGoVersion(filepath.Dir(work))
	if err != nil {
		return "", err
	}
	relSDK, err := filepath.Rel(work, sdkDir)
	if err != nil {
		return "", err
	}
	content := fmt.Sprintf("// Generated by internal/deploy/wasmbuild for the Wasm build only. Do not commit.\ngo %s\n\nuse ..\n\nreplace %s %s => ./%s\n",
		goVersion, abibridge.SDKModule, abibridge.SDKVersion, filepath.ToSlash(relSDK)) + strings.Join(extra, "")
	path := filepath.Join(work, "go.work")
	return path, writeFileAtomic(path, []byte(content))
}

// mainGoVersion reads the go directive of the repository's go.mod: a
// workspace must not declare an older version than its modules.
func mainGoVersion(root string) (string, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "go" {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("go.mod has no go directive")
}

// writeOverlay writes the bridge sources (and, for compat builds, the patched
// runtime files) under work and an overlay file mapping them into place.
func writeOverlay(ctx context.Context, work, sdkDir string, compat envoyCompat) (string, error) {
	replace := map[string]string{}
	bridgeDir := filepath.Join(work, "bridge")
	if err := os.MkdirAll(bridgeDir, 0o755); err != nil {
		return "", err
	}
	internalDir := filepath.Join(sdkDir, "proxywasm", "internal")
	if _, err := os.Stat(internalDir); err != nil {
		return "", fmt.Errorf("the SDK copy has no proxywasm/internal: %w", err)
	}
	for _, f := range abibridge.Files() {
		src := filepath.Join(bridgeDir, f.Name)
		if err := writeFileAtomic(src, f.Source); err != nil {
			return "", err
		}
		replace[filepath.Join(internalDir, f.Name)] = src
	}
	if compat.enabled {
		patched, err := writeRuntimePatch(ctx, work)
		if err != nil {
			return "", err
		}
		for k, v := range patched {
			replace[k] = v
		}
	}
	data, err := json.MarshalIndent(struct{ Replace map[string]string }{replace}, "", "  ")
	if err != nil {
		return "", err
	}
	name := "overlay.json"
	if compat.enabled {
		name = "overlay-envoy-compat.json"
	}
	path := filepath.Join(work, name)
	return path, writeFileAtomic(path, data)
}

// goBuild runs the Wasm build itself.
// The module's main package logs build (its version line) at VM start.
func goBuild(ctx context.Context, root, goWork, overlay, pkg, out, build string, verbose bool) error {
	args := []string{"build", "-buildmode=c-shared", "-trimpath", "-overlay", overlay,
		"-ldflags", "-s -w -X " + strconv.Quote("main.build="+build), "-o", out, pkg}
	env := []string{"GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOWORK=" + goWork}
	if verbose {
		fmt.Println("wasmbuild:", strings.Join(env, " "), "go", strings.Join(args, " "))
	}
	if _, err := goCmd(ctx, root, env, args...); err != nil {
		return fmt.Errorf("building the Wasm module failed: %w", err)
	}
	return nil
}
