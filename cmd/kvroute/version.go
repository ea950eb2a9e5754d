package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/internal/buildinfo"
)

// readArchiveModule returns plugin.wasm from an OCI image archive; set by
// oci.go, which the metrics-only build leaves out (and with it the OCI
// libraries), where version reads .wasm files only.
var readArchiveModule func(path string) ([]byte, error)

// versionReport is what `kvroute version --json` prints for one artefact.
type versionReport struct {
	File string `json:"file,omitempty"`
	buildinfo.Info
	Envoy    string `json:"envoy,omitempty"`
	Module   string `json:"module,omitempty"`
	Platform string `json:"platform,omitempty"`
}

func init() {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version [FILE.wasm | FILE-oci.tar]...",
		Short: "Print the version of this binary, or of Wasm modules and their OCI image archives",
		Long: `version prints this binary's release version, source revision, Go version and
main module. Given files, it prints what each Wasm module records about its
build instead: version, revision, Go version and the Envoy variant it was built
for (standard for Envoy 1.39 and later, envoy-compat for Envoy 1.33 to 1.38).
A file may be a module (dist/kvroute.wasm) or an OCI image archive written by
'kvroute oci build' (dist/kvroute-oci.tar).`,
		RunE: func(cmd *cobra.Command, files []string) error {
			var reports []versionReport
			if len(files) == 0 {
				path, ver := buildinfo.MainModule()
				if path != "" {
					path += " " + ver
				}
				reports = append(reports, versionReport{Info: buildinfo.Binary(), Module: path, Platform: runtime.GOOS + "/" + runtime.GOARCH})
			}
			var errs []error
			for _, f := range files {
				r, err := moduleVersion(f)
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", f, err))
					continue
				}
				reports = append(reports, r)
			}
			if err := printVersions(cmd.OutOrStdout(), reports, asJSON); err != nil {
				return err
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, one object per line")
	addCommand(cmd)
}

// moduleVersion reads the build record of a module or of the module inside
// an OCI image archive.
func moduleVersion(path string) (versionReport, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return versionReport{}, err
	}
	if !strings.HasPrefix(string(data[:min(len(data), 4)]), "\x00asm") {
		if readArchiveModule == nil {
			return versionReport{}, errors.New("not a Wasm module (this metrics-only build reads .wasm files, not image archives)")
		}
		if data, err = readArchiveModule(path); err != nil {
			return versionReport{}, err
		}
	}
	info, err := buildinfo.FromWasm(data)
	if err != nil {
		return versionReport{}, err
	}
	r := versionReport{File: path, Info: info}
	if v, err := buildinfo.LookupVariant(info.Variant); err == nil {
		r.Envoy = v.Envoy
	}
	return r, nil
}

func printVersions(w io.Writer, reports []versionReport, asJSON bool) error {
	for _, r := range reports {
		if asJSON {
			b, err := json.Marshal(r)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%s\n", b)
			continue
		}
		if r.File == "" {
			fmt.Fprintf(w, "kvroute %s\n", r.Info)
			if r.Module != "" {
				fmt.Fprintf(w, "module   %s\n", r.Module)
			}
			fmt.Fprintf(w, "platform %s\n", r.Platform)
			continue
		}
		line := fmt.Sprintf("%s: kvroute %s", r.File, r.Info)
		if r.Variant != "" {
			line += ", " + r.Variant + " build"
			if r.Envoy != "" {
				line += ", for " + r.Envoy
			}
		}
		fmt.Fprintln(w, line)
	}
	return nil
}
