// Command kvroute is the one CLI of the project: the cluster-metrics service
// (`metrics`), the engine simulator (`sim`), the routing benchmark (`bench`),
// the demo (`demo`), the OCI image tool (`oci`) and `version`.
//
// Each subcommand lives in its own file and registers itself with
// addCommand from an init function, so the concerns stay apart. Built with
// -tags metricsonly (the metrics service image, internal/deploy/distbuild), only
// `metrics` and `version` are compiled in: the files of the other commands
// carry a !metricsonly constraint, which keeps the simulator, plotting, Wasm
// runtime and OCI code out of the service's binary.
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

var rootCmd = &cobra.Command{
	Use:           "kvroute",
	Short:         "KV-cache-aware LLM inference routing for Envoy",
	SilenceUsage:  true,
	SilenceErrors: true,
	// An unknown subcommand names the nearest ones ("Did you mean this?").
	SuggestionsMinimumDistance: suggestDistance,
}

// addCommand registers a subcommand; called from each subcommand file's init.
func addCommand(c *cobra.Command) { rootCmd.AddCommand(c) }

// suggestDistance is how far (in edits) a mistyped subcommand may be from
// the ones suggested; cobra's own default, set here because its
// SuggestionsFor reads the field as zero until the root has suggested once.
const suggestDistance = 2

// groupCommand returns a command that only holds subcommands. Left to
// cobra, such a command prints its help and exits 0 for any argument, so
// `kvroute oci biuld` would look like success; this one refuses an unknown
// subcommand and names the nearest, as the root command does.
func groupCommand(use, short string) *cobra.Command {
	return &cobra.Command{
		Use:                        use,
		Short:                      short,
		SuggestionsMinimumDistance: suggestDistance,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return errors.New(msg)
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
}
func main() {
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvroute:", err)
		os.Exit(1)
	}
}
