// Package manifests checks the deployment files kvroute ships against the
// real API types of the systems that will load them, because no Envoy,
// Istio or Envoy Gateway can run where the project is built and a manifest
// that fails to load is found only by a user.
//
// Every check is a strict decode into the generated types, never a schema of
// our own:
//
//   - Envoy YAML (a bootstrap, or a fragment of one) is decoded with protojson
//     into go-control-plane's types. Unknown fields fail, and every
//     typed_config must resolve to a registered type (register.go imports the
//     extensions the manifests use). The result passes the generated
//     ValidateAll, the protoc-gen-validate rules Envoy itself enforces.
//   - Kubernetes YAML is split into documents and each decoded by its
//     apiVersion and kind: Istio's EnvoyFilter and WasmPlugin specs into
//     istio.io/api protos, Envoy Gateway's policies into its api module, Gateway
//     API and core objects into their Go types; unknown fields fail. The Envoy
//     fragments inside them (EnvoyFilter patch values, EnvoyPatchPolicy JSON
//     patches applied to the resource Envoy Gateway would generate) are then
//     validated as above.
//   - Every Wasm plugin configuration found along the way is returned as a
//     Plugin, so callers can hand it to the filter's own configuration parser.
//
// Errors name the file, the object and the field, in the words of the
// decoder that rejected it.
//
// This package imports heavy modules (go-control-plane, Istio, Envoy
// Gateway, Kubernetes). It is for tests and the CLI only: nothing compiled
// into the Wasm module may import it.
package manifests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Plugin is one Wasm plugin configuration found in a manifest.
type Plugin struct {
	// Where locates it for messages: file, object and field path.
	Where string
	// Doc and Path locate the configuration in the file: the document
	// index and the field path of the configuration value (-1 and "" when
	// it has no place in the file).
	Doc  int
	Path string
	// RootID is the plugin's root id (WasmPlugin pluginName, EnvoyExtensionPolicy rootID).
	RootID string
	// VMID is the vm_id the plugin runs in ("" where the platform sets it).
	VMID string
	// AllowOnHeadersStopIteration is the Wasm filter setting body routing
	// needs; nil when the platform cannot express it.
	AllowOnHeadersStopIteration *bool
	// HostEnvKeys are the environment variables of the Envoy process the VM
	// can read (vm_config.environment_variables.host_env_keys, WasmPlugin
	// vmConfig.env with valueFrom HOST, Envoy Gateway env.hostKeys).
	HostEnvKeys []string
	// Config is the plugin configuration, the JSON the filter receives.
	Config []byte
}

// Result is what a checked file holds.
type Result struct {
	File string
	// Envoy holds the decoded Envoy resources: the bootstrap for a standalone
	// config, the validated fragments for Kubernetes manifests.
	Envoy []EnvoyResource
	// Objects lists the Kubernetes objects, decoded into their Go types.
	Objects []Object
	// Plugins lists every Wasm plugin configuration found.
	Plugins []Plugin
}

// CheckFile checks one file: see Check.
func CheckFile(path string) (*Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Check(filepath.ToSlash(path), data)
}

// Check checks data read from name (used in messages only): Kubernetes
// manifests (documents with apiVersion and kind), an Envoy bootstrap, or a
// kvroute plugin configuration (JSON that is neither). It decodes it into
// the real API types, then runs kvroute's own checks (checkKvroute): the
// error, a Problems, lists every problem with its line and field path. The
// Result holds what decoded, also when there are problems.
func Check(name string, data []byte) (*Result, error) {
	r := &report{file: name}
	if len(bytes.TrimSpace(data)) == 0 {
		r.add(-1, "", "the file is empty")
		return &Result{File: name}, r.result(data)
	}
	var res *Result
	switch detect(data) {
	case kindKubernetes:
		res = checkKubernetes(r, data)
	case kindPlugin:
		res = checkPluginFile(r, data)
	default:
		res = checkBootstrap(r, data)
	}
	checkKvroute(r, res)
	return res, r.result(data)
}

// CheckTogether checks Kubernetes manifest files as one deployment, for a
// deployment split across files: each file is checked as Check does, and
// kvroute's wiring checks see the objects of all of them (a Gateway in one
// file, its policies in another). Each problem names the file and line it
// is in; a problem of the whole deployment names every file.
func CheckTogether(paths []string) (*Result, error) {
	type span struct {
		name  string
		first int // the file's first line in the joined text
	}
	var all bytes.Buffer
	var spans []span
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		if detect(data) != kindKubernetes {
			return nil, fmt.Errorf("%s: not Kubernetes manifests: only those can be checked together", p)
		}
		spans = append(spans, span{filepath.ToSlash(p), bytes.Count(all.Bytes(), []byte("\n")) + 1})
		all.Write(data)
		if !bytes.HasSuffix(data, []byte("\n")) {
			all.WriteByte('\n')
		}
		all.WriteString("---\n")
	}
	names := make([]string, len(spans))
	for i, s := range spans {
		names[i] = s.name
	}
	joined := strings.Join(names, "+")
	res, err := Check(joined, all.Bytes())
	var ps Problems
	if !errors.As(err, &ps) {
		return res, err
	}
	for i := range ps {
		line := ps[i].Line
		for _, s := range spans {
			if line > 0 && line >= s.first {
				ps[i].File, ps[i].Line = s.name, line-s.first+1
			}
		}
	}
	return res, ps
}

// IsKubernetesFile reports whether the file at path holds Kubernetes
// manifests (false when it cannot be read: CheckFile says why).
func IsKubernetesFile(path string) bool {
	data, err := os.ReadFile(path)
	return err == nil && detect(data) == kindKubernetes
}

type fileKind int

const (
	kindBootstrap fileKind = iota
	kindKubernetes
	kindPlugin
)

// detect tells the three kinds apart: Kubernetes manifests have a top-level
// apiVersion, a bootstrap has top-level fields of Bootstrap, and a plugin
// configuration is a JSON object with neither.
func detect(data []byte) fileKind {
	for _, line := range bytes.Split(data, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("apiVersion:")) {
			return kindKubernetes
		}
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return kindBootstrap
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(trimmed, &top) != nil {
		return kindPlugin // config.Parse says what is wrong with it
	}
	if _, ok := top["apiVersion"]; ok {
		return kindKubernetes
	}
	fields := (&bootstrapv3.Bootstrap{}).ProtoReflect().Descriptor().Fields()
	for k := range top {
		if fields.ByName(protoreflect.Name(k)) != nil || fields.ByJSONName(k) != nil {
			return kindBootstrap
		}
	}
	return kindPlugin
}

// checkPluginFile takes the whole file as one plugin configuration; its
// root id is not known, so both filters' checks apply to what it sets.
func checkPluginFile(r *report, data []byte) *Result {
	return &Result{File: r.file, Plugins: []Plugin{{Where: r.file, Doc: 0, Config: data}}}
}
