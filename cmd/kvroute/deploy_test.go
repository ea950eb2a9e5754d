package main

import (
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/deploy/manifests"
)

// TestShippedMetricsDeploymentArgs parses the container arguments of the
// shipped `kvroute metrics` Deployment with the real command's flags, so a
// renamed or removed flag breaks here and not in a user's cluster.
func TestShippedMetricsDeploymentArgs(t *testing.T) {
	const file = "../../envoy/kubernetes/metrics.yaml"
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	res, err := manifests.Check(file, data)
	if err != nil {
		t.Fatal(err)
	}
	checkMetricsArgs(t, res)
}

// checkMetricsArgs parses the args of the `kvroute metrics` Deployment in
// res with the command's own flags and checks what the wiring needs.
func checkMetricsArgs(t *testing.T, res *manifests.Result) {
	t.Helper()
	var args []string
	for _, o := range res.Objects {
		if d, ok := o.Value.(*appsv1.Deployment); ok {
			args = d.Spec.Template.Spec.Containers[0].Args
		}
	}
	if len(args) == 0 || args[0] != "metrics" {
		t.Fatalf("container args %q do not start with the metrics subcommand", args)
	}
	cmd, rest, err := rootCmd.Find(args[:1])
	if err != nil || cmd.Name() != "metrics" || len(rest) != 0 {
		t.Fatalf("no metrics command: %v", err)
	}
	// A fresh flag set of the same names and types: parsing into the
	// command's own flags would change its state for other tests.
	fs := pflag.NewFlagSet("metrics", pflag.ContinueOnError)
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		switch f.Value.Type() {
		case "int":
			fs.Int(f.Name, 0, "")
		case "bool":
			fs.Bool(f.Name, false, "")
		case "duration":
			fs.Duration(f.Name, 0, "")
		case "stringArray":
			fs.StringArray(f.Name, nil, "")
		case "stringSlice":
			fs.StringSlice(f.Name, nil, "")
		default:
			fs.String(f.Name, "", "")
		}
	})
	if err := fs.Parse(args[1:]); err != nil {
		t.Fatalf("the shipped args do not parse with `kvroute metrics` flags: %v", err)
	}
	if d, _ := fs.GetString("discovery"); d != "kubernetes" {
		t.Errorf("--discovery = %q, want kubernetes", d)
	}
	if s, _ := fs.GetString("service"); s == "" {
		t.Error("kubernetes discovery without --service")
	}
	gws, _ := fs.GetStringArray("gateway")
	if len(gws) == 0 {
		t.Fatal("no --gateway")
	}
	for _, g := range gws {
		u, err := url.Parse(g)
		if err != nil || u.Path != config.DefaultStatePath || u.Port() != "9002" {
			t.Errorf("--gateway %q: want http://HOST:9002%s (the state listener of the shipped gateways)", g, config.DefaultStatePath)
		}
	}
	tf, _ := fs.GetString("token-file")
	if !strings.HasPrefix(tf, "/var/run/kvroute/") {
		t.Errorf("--token-file %q is not under the Secret's mount /var/run/kvroute", tf)
	}
}
