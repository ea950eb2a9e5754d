//go:build !metricsonly

package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/server"
	"github.com/kvroute/kvroute/snapshot"
)

func init() {
	var o server.Options
	cmd := &cobra.Command{
		Use:   "sim --replicas N --port-base P [--role prefill|decode|both] [--time-scale X]",
		Short: "Serve simulated vLLM engines over HTTP (OpenAI API, /metrics, ORCA, P/D)",
		Long: `sim starts N OpenAI-compatible servers on consecutive ports, each running the
vLLM-like engine model in scaled real time: /v1/completions and
/v1/chat/completions (streamed or not, with usage.prompt_tokens_details.cached_tokens),
/metrics with vLLM's metric names, the ORCA endpoint-load-metrics header on
request, NixlConnector kv_transfer_params and SGLang bootstrap pairing for
prefill/decode roles. It runs until interrupted.

--time-scale is wall-clock seconds per simulated second: 1 is real time,
0.1 ten times faster, 0 no waiting at all.

Profiles: ` + strings.Join(sim.ProfileNames(), ", ") + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.TimeScaleSet = true
			// Listen for Ctrl-C before the engines announce themselves, so a
			// signal sent once "serving" is printed always stops them.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			f, err := server.Start(o)
			if err != nil {
				return err
			}
			defer f.Close()
			out := cmd.OutOrStdout()
			for _, s := range f.Servers {
				p := s.Profile()
				fmt.Fprintf(out, "engine %s role=%s profile=%s model=%s kv_blocks=%d\n", s.Addr, s.Role, p.Name, o.Model, p.NumGPUBlocks())
			}
			fmt.Fprintln(out, "serving; Ctrl-C to stop")
			<-ctx.Done()
			return nil
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&o.Replicas, "replicas", 1, "number of engine servers")
	fl.IntVar(&o.PortBase, "port-base", 8000, "port of the first server; the others follow (0: any free ports)")
	fl.StringVar(&o.Host, "host", "127.0.0.1", "listen address")
	fl.StringVar(&o.Role, "role", snapshot.RoleBoth, "prefill, decode or both")
	fl.Float64Var(&o.TimeScale, "time-scale", 1, "wall-clock seconds per simulated second")
	fl.StringVar(&o.Profile, "profile", sim.DefaultProfile, "engine cost profile")
	fl.StringVar(&o.Model, "model", "llama-3-8b", "served model name")
	fl.IntVar(&o.KVBlocks, "kv-blocks", 0, "override the profile's KV capacity in 16-token blocks (0: from the profile)")
	fl.IntVar(&o.MaxModelLen, "max-model-len", 131072, "context limit in tokens")
	addCommand(cmd)
}
