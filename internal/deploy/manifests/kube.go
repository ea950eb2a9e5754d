package manifests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"strconv"
	"strings"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
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
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Object is one Kubernetes object decoded into its Go type.
type Object struct {
	Where string
	// Doc is the index of its document among the file's non-empty ones.
	Doc        int
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
	r := &report{file: name}
	docs := splitDocuments(r, data)
	if len(r.probs) > 0 {
		return nil, r.probs
	}
	return docs, nil
}

func splitDocuments(r *report, data []byte) [][]byte {
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			r.add(len(docs), "", "%v", err)
			return docs
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			// The parser's line counts from the document's start.
			line := yamlErrLine(err)
			if at := bytes.Index(data, doc); line > 0 && at >= 0 {
				line += bytes.Count(data[:at], []byte("\n"))
			}
			r.probs = append(r.probs, Problem{File: r.file, Line: line, Msg: err.Error(), doc: -1})
			continue
		}
		if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
			continue
		}
		docs = append(docs, js)
	}
}

func checkKubernetes(r *report, data []byte) *Result {
	res := &Result{File: r.file}
	for i, doc := range splitDocuments(r, data) {
		if obj, ok := decodeObject(r, i, doc); ok {
			res.Objects = append(res.Objects, obj)
		}
	}
	for _, obj := range res.Objects {
		switch v := obj.Value.(type) {
		case *IstioObject:
			checkIstio(r, res, obj, v)
		}
	}
	checkEnvoyGateway(r, res)
	return res
}

// decodeObject decodes one document by apiVersion and kind, finding every
// unknown or duplicate field at every level.
func decodeObject(r *report, doc int, js []byte) (Object, bool) {
	var tm typeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		r.add(doc, "", "%v", err)
		return Object{}, false
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		r.add(doc, "", "apiVersion and kind are required")
		return Object{}, false
	}
	key := tm.APIVersion + "/" + tm.Kind
	obj := Object{APIVersion: tm.APIVersion, Kind: tm.Kind, Doc: doc}
	if mk, ok := istioTypes[key]; ok {
		var env istioEnvelope
		if !decodeStrict(r, doc, js, &env) {
			return Object{}, false
		}
		spec := mk()
		for _, p := range decodeProto(env.Spec, spec) {
			r.add(doc, joinField("spec", p.path), "%s", p.msg)
		}
		obj.Name, obj.Namespace = env.Metadata.Name, env.Metadata.Namespace
		obj.Value = &IstioObject{Metadata: env.Metadata, Spec: spec}
	} else {
		mk, ok := kubeTypes[key]
		if !ok {
			r.add(doc, "kind", "unknown apiVersion/kind %q: the checker knows no type for it (add it to kubeTypes in internal/deploy/manifests)", key)
			return Object{}, false
		}
		v := mk()
		if !decodeStrict(r, doc, js, v) {
			return Object{}, false
		}
		if meta, ok := v.(metav1.Object); ok {
			obj.Name, obj.Namespace = meta.GetName(), meta.GetNamespace()
		}
		obj.Value = v
	}
	if obj.Name == "" {
		r.add(doc, "metadata", "metadata.name is required")
	}
	obj.Where = r.file + ": " + tm.Kind + " " + obj.Name
	return obj, true
}

// decodeStrict decodes a Kubernetes object, reporting each unknown or
// duplicate field at its path; false when the document does not decode.
func decodeStrict(r *report, doc int, js []byte, v any) bool {
	strict, err := kjson.UnmarshalStrict(js, v)
	if err != nil {
		r.add(doc, typeErrPath(err), "%v", err)
		return false
	}
	for _, e := range strict {
		var fe kjson.FieldError
		if errors.As(e, &fe) {
			r.add(doc, fe.FieldPath(), "%s", strings.TrimSuffix(e.Error(), " "+strconv.Quote(fe.FieldPath())))
			continue
		}
		r.add(doc, "", "%v", e)
	}
	return true
}

// goStructField finds the path in encoding/json's type errors: "Go struct
// field Deployment.spec.replicas of type int32".
var goStructField = regexp.MustCompile(`Go struct field [A-Za-z0-9_]+\.(\S+) of type`)

func typeErrPath(err error) string {
	if m := goStructField.FindStringSubmatch(err.Error()); m != nil {
		return m[1]
	}
	return ""
}
