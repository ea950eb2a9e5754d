package buildinfo

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
)

// Source returns the Info of a build made now from the checkout at dir:
// Release, the git revision (empty outside a git checkout or without git),
// whether tracked files have uncommitted changes, and the version of the go
// command on PATH. The build tools (internal/deploy/wasmbuild, internal/deploy/distbuild)
// stamp it into what they build.
func Source(ctx context.Context, dir string) Info {
	info := Info{Version: Release}
	if out, err := run(ctx, dir, "git", "rev-parse", "HEAD"); err == nil {
		info.Revision = out
		if st, err := run(ctx, dir, "git", "status", "--porcelain", "--untracked-files=no"); err == nil {
			info.Modified = st != ""
		}
	}
	if out, err := run(ctx, dir, "go", "env", "GOVERSION"); err == nil {
		info.Go = out
	}
	return info
}

// LDFlags returns the linker flags that stamp info's version and revision
// into a binary importing this package (Binary reads them back).
func (i Info) LDFlags() string {
	flags := []string{"-X", ModulePath + "/internal/buildinfo.version=" + i.Version}
	if i.Revision != "" {
		flags = append(flags, "-X", ModulePath+"/internal/buildinfo.revision="+i.Revision)
	}
	if i.Modified {
		flags = append(flags, "-X", ModulePath+"/internal/buildinfo.modified=true")
	}
	return strings.Join(flags, " ")
}

func run(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		return "", err
	}
	return strings.TrimSpace(out.String()), nil
}
