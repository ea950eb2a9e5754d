// Command kvroute is the one CLI of the project: the cluster-metrics service
// (`metrics`), the engine simulator (`sim`), the routing benchmark (`bench`),
// the demo (`demo`) and the OCI image tool (`oci`).
//
// Each subcommand lives in its own file and registers itself with
// addCommand from an init function, so the concerns stay apart.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

var rootCmd = &cobra.Command{
	Use:           "kvroute",
	Short:         "KV-cache-aware LLM inference routing for Envoy",
	SilenceUsage:  true,
	SilenceErrors: true,
}

// addCommand registers a subcommand; called from each subcommand file's init.
func addCommand(c *cobra.Command) { rootCmd.AddCommand(c) }

func main() {
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvroute:", err)
		os.Exit(1)
	}
}
