package manifests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	istioext "istio.io/api/extensions/v1alpha1"
	istionet "istio.io/api/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// Object is one Kubernetes object decoded into its Go type.
type Object struct {
	Where      string
	APIVersion string
	Kind       string
	Name       string
	Namespace  string
	// Value is the typed object: a k8s.io/api or Envoy Gateway struct, or
	// for Istio kinds an IstioObject holding the spec proto.
	Value any
}

// IstioObject is an Istio resource: Kubernetes metadata and the spec proto
// from istio.io/api.
type IstioObject struct {
	Metadata metav1.ObjectMeta
	Spec     proto.Message
}

// kubeTypes maps apiVersion/kind to a new Go value of that kind.
var kubeTypes = map[string]func() any{
	"v1/Namespace":                                        func() any { return &corev1.Namespace{} },
	"v1/Service":                                          func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                                   func() any { return &corev1.ServiceAccount{} },
	"v1/Secret":                                           func() any { return &corev1.Secret{} },
	"v1/ConfigMap":                                        func() any { return &corev1.ConfigMap{} },
	"apps/v1/Deployment":                                  func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":                       func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy":                  func() any { return &networkingv1.NetworkPolicy{} },
	"rbac.authorization.k8s.io/v1/Role":                   func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding":            func() any { return &rbacv1.RoleBinding{} },
	"rbac.authorization.k8s.io/v1/ClusterRole":            func() any { return &rbacv1.ClusterRole{} },
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding":     func() any { return &rbacv1.ClusterRoleBinding{} },
	"gateway.networking.k8s.io/v1/GatewayClass":           func() any { return &gwapiv1.GatewayClass{} },
	"gateway.networking.k8s.io/v1/Gateway":                func() any { return &gwapiv1.Gateway{} },
	"gateway.networking.k8s.io/v1/HTTPRoute":              func() any { return &gwapiv1.HTTPRoute{} },
	"gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy": func() any { return &egv1a1.EnvoyExtensionPolicy{} },
	"gateway.envoyproxy.io/v1alpha1/EnvoyPatchPolicy":     func() any { return &egv1a1.EnvoyPatchPolicy{} },
	"gateway.envoyproxy.io/v1alpha1/BackendTrafficPolicy": func() any { return &egv1a1.BackendTrafficPolicy{} },
	"gateway.envoyproxy.io/v1alpha1/ClientTrafficPolicy":  func() any { return &egv1a1.ClientTrafficPolicy{} },
	"gateway.envoyproxy.io/v1alpha1/EnvoyProxy":           func() any { return &egv1a1.EnvoyProxy{} },
}

// istioTypes maps apiVersion/kind to a new spec proto.
var istioTypes = map[string]func() proto.Message{
	"networking.istio.io/v1alpha3/EnvoyFilter": func() proto.Message { return &istionet.EnvoyFilter{} },
	"networking.istio.io/v1/Gateway":           func() proto.Message { return &istionet.Gateway{} },
	"networking.istio.io/v1/VirtualService":    func() proto.Message { return &istionet.VirtualService{} },
	"networking.istio.io/v1/DestinationRule":   func() proto.Message { return &istionet.DestinationRule{} },
	"extensions.istio.io/v1alpha1/WasmPlugin":  func() proto.Message { return &istioext.WasmPlugin{} },
}

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// istioEnvelope is an Istio object before its spec is decoded as a proto.
type istioEnvelope struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       json.RawMessage   `json:"spec"`
}

// SplitDocuments returns the non-empty YAML documents of data as JSON.
func SplitDocuments(name string, data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
			continue
		}
		docs = append(docs, js)
	}
}

func checkKubernetes(name string, data []byte) (*Result, error) {
	docs, err := SplitDocuments(name, data)
	if err != nil {
		return nil, err
	}
	res := &Result{File: name}
	for i, doc := range docs {
		obj, err := decodeObject(fmt.Sprintf("%s: document %d", name, i), doc)
		if err != nil {
			return nil, err
		}
		res.Objects = append(res.Objects, obj)
	}
	for _, obj := range res.Objects {
		switch v := obj.Value.(type) {
		case *IstioObject:
			if err := checkIstio(res, obj, v); err != nil {
				return nil, err
			}
		case *corev1.Secret:
			if len(v.Data) > 0 || len(v.StringData) > 0 {
				if err := checkSecretPlaceholder(obj, v); err != nil {
					return nil, err
				}
			}
		}
	}
	if err := checkEnvoyGateway(res); err != nil {
		return nil, err
	}
	return res, nil
}

// decodeObject decodes one document by apiVersion and kind, rejecting
// unknown fields at every level.
func decodeObject(where string, doc []byte) (Object, error) {
	var tm typeMeta
	if err := json.Unmarshal(doc, &tm); err != nil {
		return Object{}, fieldErr(where, err)
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		return Object{}, fieldErr(where, errors.New("apiVersion and kind are required"))
	}
	key := tm.APIVersion + "/" + tm.Kind
	where = fmt.Sprintf("%s (%s)", where, tm.Kind)
	if mk, ok := istioTypes[key]; ok {
		var env istioEnvelope
		if err := yaml.UnmarshalStrict(doc, &env); err != nil {
			return Object{}, fieldErr(where, err)
		}
		spec := mk()
		if err := protojson.Unmarshal(env.Spec, spec); err != nil {
			return Object{}, fieldErr(where+" spec", withContext(err, env.Spec))
		}
		if env.Metadata.Name == "" {
			return Object{}, fieldErr(where, errors.New("metadata.name is required"))
		}
		return Object{Where: where + " " + env.Metadata.Name, APIVersion: tm.APIVersion, Kind: tm.Kind,
			Name: env.Metadata.Name, Namespace: env.Metadata.Namespace,
			Value: &IstioObject{Metadata: env.Metadata, Spec: spec}}, nil
	}
	mk, ok := kubeTypes[key]
	if !ok {
		return Object{}, fieldErr(where, fmt.Errorf("unknown apiVersion/kind %q: the checker knows no type for it (add it to kubeTypes in internal/manifests)", key))
	}
	v := mk()
	if err := yaml.UnmarshalStrict(doc, v); err != nil {
		return Object{}, fieldErr(where, err)
	}
	meta, ok := v.(metav1.Object)
	if !ok || meta.GetName() == "" {
		return Object{}, fieldErr(where, errors.New("metadata.name is required"))
	}
	return Object{Where: where + " " + meta.GetName(), APIVersion: tm.APIVersion, Kind: tm.Kind,
		Name: meta.GetName(), Namespace: meta.GetNamespace(), Value: v}, nil
}

// checkSecretPlaceholder refuses a shipped Secret that carries what looks
// like a real token: manifests ship a placeholder the user replaces.
func checkSecretPlaceholder(obj Object, s *corev1.Secret) error {
	for k, v := range s.StringData {
		if !bytes.Contains([]byte(v), []byte("REPLACE")) {
			return fieldErr(obj.Where, fmt.Errorf("stringData.%s must be a REPLACE-ME placeholder, never a real token", k))
		}
	}
	if len(s.Data) > 0 {
		return fieldErr(obj.Where, errors.New("data: ship the token as a stringData placeholder, never encoded"))
	}
	return nil
}
