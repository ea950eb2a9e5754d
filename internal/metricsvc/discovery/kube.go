package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Default pod labels read by Kubernetes discovery.
const (
	DefaultRoleLabel  = "kvroute.io/role"
	DefaultModelLabel = "kvroute.io/model"
)

// Kubernetes discovers engines from the EndpointSlices of a Service (or of
// every Service whose slices match Selector), watched with client-go
// informers. Only ready endpoints count. Each endpoint's pod (its
// targetRef) gives the role and model through labels; a pod without a role
// label serves both.
type Kubernetes struct {
	Client    kubernetes.Interface
	Namespace string
	// Service names one Service; Selector is a label selector over
	// EndpointSlices instead (they carry their Service's labels). Exactly
	// one is set.
	Service, Selector string
	// PortName picks the slice port by name; empty takes the first port.
	PortName     string
	KVEventsPort int // 0: do not follow KV events
	// KVEventsReplayPort is the engines' replay socket port (0: none).
	KVEventsReplayPort int
	// RoleLabel and ModelLabel are the pod label keys (defaults
	// DefaultRoleLabel, DefaultModelLabel).
	RoleLabel, ModelLabel string
	Resync                time.Duration // informer resync, default 10 min
	Log                   *slog.Logger
}

// Name implements Source.
func (k *Kubernetes) Name() string { return "kubernetes" }

func (k *Kubernetes) selector() (string, error) {
	switch {
	case k.Service != "" && k.Selector != "":
		return "", errors.New("kubernetes discovery: set either a service or a selector, not both")
	case k.Service != "":
		return discoveryv1.LabelServiceName + "=" + k.Service, nil
	case k.Selector != "":
		if _, err := labels.Parse(k.Selector); err != nil {
			return "", fmt.Errorf("kubernetes discovery: selector %q: %w", k.Selector, err)
		}
		return k.Selector, nil
	}
	return "", errors.New("kubernetes discovery: a service name or an EndpointSlice label selector is required")
}

// Run implements Source: it starts the informers, waits for their first
// sync (an error if ctx ends first) and then reports every change.
func (k *Kubernetes) Run(ctx context.Context, update func([]Endpoint)) error {
	sel, err := k.selector()
	if err != nil {
		return err
	}
	if k.Namespace == "" {
		return errors.New("kubernetes discovery: a namespace is required")
	}
	log := k.Log
	if log == nil {
		log = slog.Default()
	}
	resync := k.Resync
	if resync <= 0 {
		resync = 10 * time.Minute
	}
	sliceFactory := informers.NewSharedInformerFactoryWithOptions(k.Client, resync,
		informers.WithNamespace(k.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	podFactory := informers.NewSharedInformerFactoryWithOptions(k.Client, resync, informers.WithNamespace(k.Namespace))
	slices := sliceFactory.Discovery().V1().EndpointSlices()
	pods := podFactory.Core().V1().Pods()

	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}
	if _, err := slices.Informer().AddEventHandler(h); err != nil {
		return err
	}
	if _, err := pods.Informer().AddEventHandler(h); err != nil {
		return err
	}
	sliceFactory.Start(ctx.Done())
	podFactory.Start(ctx.Done())
	defer sliceFactory.Shutdown()
	defer podFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), slices.Informer().HasSynced, pods.Informer().HasSynced) {
		return fmt.Errorf("kubernetes discovery: informers did not sync (check RBAC: list/watch endpointslices and pods in %s)", k.Namespace)
	}
	var last []Endpoint
	first := true
	for {
		eps := k.collect(slices.Lister().EndpointSlices(k.Namespace), pods.Lister().Pods(k.Namespace), sel, log)
		if first || !Equal(eps, last) {
			first = false
			last = eps
			update(eps)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

type sliceLister interface {
	List(labels.Selector) ([]*discoveryv1.EndpointSlice, error)
}

type podGetter interface {
	Get(name string) (*corev1.Pod, error)
}

func (k *Kubernetes) collect(sl sliceLister, pl podGetter, sel string, log *slog.Logger) []Endpoint {
	s, _ := labels.Parse(sel)
	list, err := sl.List(s)
	if err != nil {
		log.Warn("listing EndpointSlices failed", "err", err)
		return nil
	}
	roleKey, modelKey := k.RoleLabel, k.ModelLabel
	if roleKey == "" {
		roleKey = DefaultRoleLabel
	}
	if modelKey == "" {
		modelKey = DefaultModelLabel
	}
	seen := map[string]bool{}
	var eps []Endpoint
	for _, es := range list {
		port := k.pickPort(es)
		if port == 0 {
			continue
		}
		for _, ep := range es.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			var role, model string
			if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
				if pod, err := pl.Get(ep.TargetRef.Name); err == nil {
					role, model = pod.Labels[roleKey], pod.Labels[modelKey]
				}
			}
			for _, ip := range ep.Addresses {
				e := Endpoint{
					Address:  net.JoinHostPort(ip, strconv.Itoa(port)),
					Role:     role,
					Model:    model,
					KVEvents: kvEventsFor(ip, k.KVEventsPort),
				}
				if e.KVEvents != "" {
					e.KVEventsReplay = kvEventsFor(ip, k.KVEventsReplayPort)
				}
				if err := e.Validate(); err != nil {
					log.Warn("skipping endpoint", "slice", es.Name, "err", err)
					continue
				}
				if !seen[e.Address] {
					seen[e.Address] = true
					eps = append(eps, e)
				}
			}
		}
	}
	return sorted(eps)
}

func (k *Kubernetes) pickPort(es *discoveryv1.EndpointSlice) int {
	for _, p := range es.Ports {
		if p.Port == nil {
			continue
		}
		if k.PortName == "" || (p.Name != nil && *p.Name == k.PortName) {
			return int(*p.Port)
		}
	}
	return 0
}
