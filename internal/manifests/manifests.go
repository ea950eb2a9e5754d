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
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Plugin is one Wasm plugin configuration found in a manifest.
type Plugin struct {
	// Where locates it: file, object and field path.
	Where string
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

// CheckFile checks one file: Kubernetes manifests (documents with apiVersion
// and kind) or an Envoy bootstrap.
func CheckFile(path string) (*Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Check(filepath.ToSlash(path), data)
}

// Check checks data read from name (used in messages only).
func Check(name string, data []byte) (*Result, error) {
	if isKubernetes(data) {
		return checkKubernetes(name, data)
	}
	return checkBootstrap(name, data)
}

// isKubernetes reports whether data looks like Kubernetes manifests: a
// top-level apiVersion key. Envoy bootstraps never have one.
func isKubernetes(data []byte) bool {
	for _, line := range bytes.Split(data, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("apiVersion:")) {
			return true
		}
	}
	return false
}

// fieldErr prefixes an error with where it happened.
func fieldErr(where string, err error) error {
	return fmt.Errorf("%s: %w", where, err)
}

// joinPath joins field path elements with dots, skipping empty ones.
func joinPath(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, ".")
}
