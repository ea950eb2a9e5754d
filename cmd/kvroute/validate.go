//go:build !metricsonly

package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/internal/deploy/manifests"
)

// The validate command runs, on a user's files, the checks the project's
// own tests run on the shipped manifests (internal/deploy/manifests.Check): a
// user who edits a manifest or a plugin configuration learns what Envoy,
// Istio, Envoy Gateway or the filter would reject before applying it.
func init() {
	var together bool
	cmd := &cobra.Command{
		Use:   "validate FILE|DIR...",
		Short: "Check plugin configurations and Envoy, Istio and Envoy Gateway manifests",
		Long: `Validate checks each file the way the project's tests check the shipped ones,
and prints every problem as FILE:LINE: FIELD.PATH: MESSAGE.

It takes:
  - a kvroute plugin configuration (JSON): the filter's own configuration parser;
  - an Envoy bootstrap (YAML or JSON): decoded into go-control-plane's types
    (unknown fields and unknown typed_config types fail) and validated with
    the rules Envoy enforces, typed configs included;
  - Kubernetes manifests: Istio EnvoyFilter and WasmPlugin (istio.io/api),
    Envoy Gateway policies (its API types, EnvoyPatchPolicy patches applied to
    the listeners Envoy Gateway would generate), Gateway API and core objects.

In every case the plugin configurations found are parsed as the filter
parses them, and the wiring kvroute needs is checked: the header the filter
writes is the one the cluster reads and is removed from clients, the buffer
limit holds the largest body, router and pd share one VM, the state token
comes from the environment. Each file is checked as a whole deployment;
with --together the Kubernetes files are checked as one (a Gateway in one
file, its policies in another). A directory is searched for .yaml, .yml
and .json files. The exit status is 1 when any file has a problem.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			files, err := validateFiles(args)
			if err != nil {
				return err
			}
			checks := make([][]string, 0, len(files))
			var kube []string
			for _, f := range files {
				if together && manifests.IsKubernetesFile(f) {
					kube = append(kube, f)
					continue
				}
				checks = append(checks, []string{f})
			}
			if len(kube) > 0 {
				checks = append(checks, kube)
			}
			bad, count := 0, 0
			for _, group := range checks {
				var err error
				if len(group) > 1 {
					_, err = manifests.CheckTogether(group)
				} else {
					_, err = manifests.CheckFile(group[0])
				}
				f := strings.Join(group, "+")
				var ps manifests.Problems
				switch {
				case err == nil:
					fmt.Fprintf(cmd.OutOrStdout(), "%s: ok\n", f)
					continue
				case errors.As(err, &ps):
					for _, p := range ps {
						fmt.Fprintln(cmd.OutOrStdout(), p.String())
					}
					count += len(ps)
				default:
					fmt.Fprintf(cmd.OutOrStdout(), "%s: %v\n", f, err)
					count++
				}
				bad += len(group)
			}
			if bad > 0 {
				return fmt.Errorf("validate: %d problem(s) in %d of %d file(s)", count, bad, len(files))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&together, "together", false, "check the Kubernetes files as one deployment split across them")
	addCommand(cmd)
}

// validateFiles expands directories into the manifest files below them.
func validateFiles(args []string) ([]string, error) {
	var out []string
	for _, a := range args {
		st, err := os.Stat(a)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			out = append(out, a)
			continue
		}
		n := len(out)
		err = filepath.WalkDir(a, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && hasExt(p, ".yaml", ".yml", ".json") {
				out = append(out, p)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		if len(out) == n {
			return nil, fmt.Errorf("%s: no .yaml, .yml or .json file in it", a)
		}
	}
	return out, nil
}

func hasExt(p string, exts ...string) bool {
	for _, e := range exts {
		if strings.HasSuffix(p, e) {
			return true
		}
	}
	return false
}
