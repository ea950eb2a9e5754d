package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	// Mozilla's CA roots, used only where the system has none: the metrics
	// image has no /etc/ssl, and a gateway state URL may be https.
	_ "golang.org/x/crypto/x509roots/fallback"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/metricsvc"
	"github.com/kvroute/kvroute/internal/metricsvc/discovery"
	"github.com/kvroute/kvroute/internal/metricsvc/push"
	"github.com/kvroute/kvroute/snapshot"
)

// metricsOptions are the `kvroute metrics` flags; a config file sets the
// same names.
type metricsOptions struct {
	config    string
	discovery string

	endpointsFile string

	dnsName    string
	port       int
	role       string
	model      string
	dnsRefresh time.Duration

	namespace  string
	service    string
	selector   string
	portName   string
	kubeconfig string
	roleLabel  string
	modelLabel string

	kvEventsPort       int
	kvEventsReplayPort int
	kvEventsTopic      string
	kvEventsListen     string
	bridgeLag          time.Duration

	scrapeInterval time.Duration
	scrapeTimeout  time.Duration
	metricsPath    string

	gateways     []string
	tokenFile    string
	tokenEnv     string
	pushInterval time.Duration
	pushTimeout  time.Duration

	listen    string
	name      string
	logLevel  string
	logFormat string
}

func init() {
	var o metricsOptions
	cmd := &cobra.Command{
		Use:   "metrics [--config FILE] [flags]",
		Short: "Cluster-metrics service: discover engines, scrape them, follow KV events, push state to every gateway",
		Long: `metrics discovers vLLM / SGLang engines (a static file, the A/AAAA records of a
headless Service, or Kubernetes EndpointSlices), scrapes each engine's /metrics
every --scrape-interval, optionally follows its KV events over ZMQ, and pushes
the fleet snapshot to every --gateway state URL with a bearer token: on every
change and at least once per --push-interval.

Its own /metrics, /healthz and /state are served on --listen.

Every flag can also be set in a YAML --config file under the flag's name
(flags given on the command line win):

  discovery: kubernetes
  namespace: llm
  service: vllm
  gateway: [http://gw-0.gw:9002/.kvroute/v1/state, http://gw-1.gw:9002/.kvroute/v1/state]
  token-file: /var/run/kvroute/token
  scrape-interval: 100ms`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyConfigFile(cmd.Flags(), o.config); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runMetrics(ctx, &o, cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.config, "config", "", "YAML file setting any of these flags by name")
	fl.StringVar(&o.discovery, "discovery", "", "static, dns or kubernetes (default: inferred from the flags given)")

	fl.StringVar(&o.endpointsFile, "endpoints-file", "", "static discovery: YAML file listing endpoints (address, role, model, adapters, kvEvents); re-read when it changes")

	fl.StringVar(&o.dnsName, "dns-name", "", "dns discovery: name whose A/AAAA records are the engines (a headless Service)")
	fl.IntVar(&o.port, "port", 8000, "dns discovery: the engines' HTTP port")
	fl.StringVar(&o.role, "role", snapshot.RoleBoth, "dns discovery: role of every engine found (prefill, decode or both)")
	fl.StringVar(&o.model, "model", "", "dns discovery: model of every engine found (default: from its metrics)")
	fl.DurationVar(&o.dnsRefresh, "dns-refresh", 5*time.Second, "dns discovery: re-resolution period")

	fl.StringVar(&o.namespace, "namespace", "", "kubernetes discovery: namespace (default: the pod's own)")
	fl.StringVar(&o.service, "service", "", "kubernetes discovery: Service whose EndpointSlices list the engines")
	fl.StringVar(&o.selector, "selector", "", "kubernetes discovery: EndpointSlice label selector, instead of --service")
	fl.StringVar(&o.portName, "port-name", "", "kubernetes discovery: EndpointSlice port name (default: the first port)")
	fl.StringVar(&o.kubeconfig, "kubeconfig", "", "kubernetes discovery: kubeconfig file (default: in-cluster credentials)")
	fl.StringVar(&o.roleLabel, "role-label", discovery.DefaultRoleLabel, "kubernetes discovery: pod label holding the role")
	fl.StringVar(&o.modelLabel, "model-label", discovery.DefaultModelLabel, "kubernetes discovery: pod label holding the model")

	fl.IntVar(&o.kvEventsPort, "kv-events-port", 0, "dns/kubernetes discovery: engines' KV event publisher port (0: do not subscribe)")
	fl.IntVar(&o.kvEventsReplayPort, "kv-events-replay-port", 0, "dns/kubernetes discovery: engines' KV event replay socket port, asked for the batches of a sequence gap (0: gaps are only counted)")
	fl.StringVar(&o.kvEventsTopic, "kv-events-topic", "", "KV event topic prefix to subscribe to (default: all)")
	fl.DurationVar(&o.bridgeLag, "kv-events-bridge-lag", 0, "how long engines' KV event batches wait for the gateways' route reports before they are bridged into kvroute's chains (default 500ms; above the gateways' state.report interval plus a POST)")
	fl.StringVar(&o.kvEventsListen, "kv-events-listen", "", "bind this address (e.g. tcp://*:5557) for engines that connect out to publish KV events under the topic kv@<pod-ip>@<model> (llm-d-inference-sim, llm-d)")

	fl.DurationVar(&o.scrapeInterval, "scrape-interval", 100*time.Millisecond, "how often each engine is scraped")
	fl.DurationVar(&o.scrapeTimeout, "scrape-timeout", 0, "timeout of one scrape (default: 80% of the scrape interval)")
	fl.StringVar(&o.metricsPath, "metrics-path", "/metrics", "the engines' metrics path")

	fl.StringArrayVar(&o.gateways, "gateway", nil, "gateway state URL, e.g. http://gw:9002/.kvroute/v1/state (repeat for each gateway)")
	fl.StringVar(&o.tokenFile, "token-file", "", "file holding the state bearer token (re-read when it changes)")
	fl.StringVar(&o.tokenEnv, "token-env", "KVROUTE_STATE_TOKEN", "environment variable holding the state bearer token, used without --token-file")
	fl.DurationVar(&o.pushInterval, "push-interval", time.Second, "longest time between two pushes (changes are pushed at once)")
	fl.DurationVar(&o.pushTimeout, "push-timeout", 2*time.Second, "timeout of one push")

	fl.StringVar(&o.listen, "listen", ":9090", "address of this service's /metrics, /healthz and /state")
	fl.StringVar(&o.name, "name", "", "instance name carried in snapshots (default: the host name)")
	fl.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&o.logFormat, "log-format", "json", "json or text")
	addCommand(cmd)
}

// applyConfigFile sets every flag named in the YAML file that was not given
// on the command line. Unknown names are errors, so a typo is not ignored.
func applyConfigFile(fl *pflag.FlagSet, path string) error {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		f := fl.Lookup(k)
		if f == nil || k == "config" {
			return fmt.Errorf("config file %s: unknown setting %q (settings are the flag names of `kvroute metrics --help`)", path, k)
		}
		if f.Changed {
			continue
		}
		vals := []any{doc[k]}
		if list, ok := doc[k].([]any); ok {
			vals = list
		}
		for _, v := range vals {
			s := fmt.Sprint(v)
			if fv, ok := v.(float64); ok && fv == float64(int64(fv)) {
				s = fmt.Sprint(int64(fv)) // YAML numbers arrive as float64
			}
			if err := fl.Set(k, s); err != nil {
				return fmt.Errorf("config file %s: %s: %w", path, k, err)
			}
		}
	}
	return nil
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: durationsAsText}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want json or text", format)
}

// durationsAsText writes durations as Go duration strings ("100ms", "2s"):
// slog's JSON handler would write them as integer nanoseconds, which no log
// reader takes for a duration.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// source builds the discovery source the flags describe.
func (o *metricsOptions) source(log *slog.Logger) (discovery.Source, error) {
	kind := o.discovery
	if kind == "" {
		var kinds []string
		if o.endpointsFile != "" {
			kinds = append(kinds, "static")
		}
		if o.dnsName != "" {
			kinds = append(kinds, "dns")
		}
		if o.service != "" || o.selector != "" {
			kinds = append(kinds, "kubernetes")
		}
		if len(kinds) != 1 {
			return nil, errors.New("choose one discovery: --endpoints-file FILE, --dns-name NAME or --service NAME (with --discovery static|dns|kubernetes)")
		}
		kind = kinds[0]
	}
	switch kind {
	case "static":
		if o.endpointsFile == "" {
			return nil, errors.New("static discovery needs --endpoints-file")
		}
		return &discovery.File{Path: o.endpointsFile, Log: log}, nil
	case "dns":
		if o.dnsName == "" {
			return nil, errors.New("dns discovery needs --dns-name")
		}
		return &discovery.DNS{Host: o.dnsName, Port: o.port, Role: o.role, Model: o.model,
			KVEventsPort: o.kvEventsPort, KVEventsReplayPort: o.kvEventsReplayPort, Refresh: o.dnsRefresh, Log: log}, nil
	case "kubernetes":
		var cfg *rest.Config
		var err error
		if o.kubeconfig != "" {
			cfg, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
		} else {
			cfg, err = rest.InClusterConfig()
		}
		if err != nil {
			return nil, fmt.Errorf("kubernetes discovery: %w (outside a cluster, give --kubeconfig)", err)
		}
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("kubernetes discovery: %w", err)
		}
		ns := o.namespace
		if ns == "" {
			b, err := os.ReadFile(serviceAccountNamespace)
			if err != nil {
				return nil, errors.New("kubernetes discovery: give --namespace (the pod's own namespace is unreadable)")
			}
			ns = strings.TrimSpace(string(b))
		}
		return &discovery.Kubernetes{Client: client, Namespace: ns, Service: o.service, Selector: o.selector,
			PortName: o.portName, KVEventsPort: o.kvEventsPort, KVEventsReplayPort: o.kvEventsReplayPort, RoleLabel: o.roleLabel, ModelLabel: o.modelLabel, Log: log}, nil
	}
	return nil, fmt.Errorf("--discovery %q: want static, dns or kubernetes", kind)
}

// token picks the state token source: the file when given, else the
// environment variable.
func (o *metricsOptions) token() (push.TokenSource, error) {
	if o.tokenFile != "" {
		return &push.FileToken{Path: o.tokenFile}, nil
	}
	if v := os.Getenv(o.tokenEnv); v != "" {
		return push.StaticToken(strings.TrimSpace(v)), nil
	}
	if len(o.gateways) > 0 {
		return nil, fmt.Errorf("no state token: give --token-file or set $%s (the gateways refuse unauthenticated pushes)", o.tokenEnv)
	}
	return nil, nil
}

func runMetrics(ctx context.Context, o *metricsOptions, logOut io.Writer) error {
	log, err := newLogger(logOut, o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	src, err := o.source(log)
	if err != nil {
		return err
	}
	tok, err := o.token()
	if err != nil {
		return err
	}
	name := o.name
	if name == "" {
		name, _ = os.Hostname()
	}
	svc, err := metricsvc.New(metricsvc.Config{
		Source:         src,
		ScrapeInterval: o.scrapeInterval,
		ScrapeTimeout:  o.scrapeTimeout,
		MetricsPath:    o.metricsPath,
		Gateways:       o.gateways,
		Token:          tok,
		PushInterval:   o.pushInterval,
		PushTimeout:    o.pushTimeout,
		KVEventsTopic:  o.kvEventsTopic,
		KVEventsListen: o.kvEventsListen,
		BridgeLag:      o.bridgeLag,
		Name:           name,
		Log:            log,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", o.listen, err)
	}
	srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	log.Info("serving /metrics, /healthz and /state", "listen", ln.Addr().String())
	runErr := svc.Run(ctx)
	shutCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	srv.Shutdown(shutCtx)
	return runErr
}
