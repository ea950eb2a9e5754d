package discovery

import (
	"context"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"
)

// examples/two-models/engines.yaml runs two models behind one Service:
// each Deployment's pods are selected by the Service and labelled with the
// model they serve (the name they serve it under), and Kubernetes
// discovery of that Service reports each engine with its model. The
// EndpointSlice is built from the Deployments' pods as Kubernetes' own
// controller would.
func TestTwoModelsExample(t *testing.T) {
	data, err := os.ReadFile("../../../examples/two-models/engines.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var svc *corev1.Service
	var deps []appsv1.Deployment
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "Service":
			svc = &corev1.Service{}
			err = yaml.UnmarshalStrict([]byte(doc), svc)
		case "Deployment":
			deps = append(deps, appsv1.Deployment{})
			err = yaml.UnmarshalStrict([]byte(doc), &deps[len(deps)-1])
		default:
			t.Fatalf("unexpected kind %q", meta.Kind)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if svc == nil || len(deps) != 2 {
		t.Fatalf("want a Service and two Deployments, got %v and %d", svc != nil, len(deps))
	}
	ready := true
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svc.Name + "-x", Namespace: svc.Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	port, name := svc.Spec.Ports[0].Port, svc.Spec.Ports[0].Name
	slice.Ports = []discoveryv1.EndpointPort{{Name: &name, Port: &port}}
	objects := []runtime.Object{slice}
	want := map[string]int{}
	for i, d := range deps {
		tpl := d.Spec.Template
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(tpl.Labels)) {
			t.Errorf("%s: the Service %s does not select its pods", d.Name, svc.Name)
		}
		model := tpl.Labels[DefaultModelLabel]
		args := tpl.Spec.Containers[0].Args
		if j := slices.Index(args, "--served-model-name"); model == "" || j < 0 || args[j+1] != model {
			t.Errorf("%s: label %s=%q, args %v: the label must name the model as the engine serves it", d.Name, DefaultModelLabel, model, args)
		}
		want[model] = int(*d.Spec.Replicas)
		for r := 0; r < int(*d.Spec.Replicas); r++ {
			pod := d.Name + "-" + string(rune('a'+r))
			objects = append(objects, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: d.Namespace, Labels: tpl.Labels}})
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{"10.1." + string(rune('0'+i)) + "." + string(rune('1'+r))},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: pod, Namespace: d.Namespace}})
		}
	}
	k := &Kubernetes{Client: fake.NewClientset(objects...), Namespace: svc.Namespace, Service: svc.Name, Log: quiet()}
	var u updates
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = k.Run(ctx, u.add) }()
	eps := u.waitFor(t, "the example's engines", func(e []Endpoint) bool { return len(e) == len(slice.Endpoints) })
	got := map[string]int{}
	for _, e := range eps {
		got[e.Model]++
	}
	if len(want) != 2 || !maps.Equal(got, want) {
		t.Errorf("discovered engines by model %v, want %v", got, want)
	}
}
