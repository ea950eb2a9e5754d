package manifests

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"
)

// EnvoyResource is one decoded and validated Envoy message.
type EnvoyResource struct {
	Where   string
	Message proto.Message
}

// validatorAll is what protoc-gen-validate generates on every Envoy message.
type validatorAll interface{ ValidateAll() error }

// DecodeEnvoyJSON decodes data into msg the strict way (unknown fields and
// unresolvable typed_config types fail) and runs the generated ValidateAll.
func DecodeEnvoyJSON(where string, data []byte, msg proto.Message) error {
	if err := protojson.Unmarshal(data, msg); err != nil {
		return fieldErr(where, withContext(err, data))
	}
	return validateEnvoy(where, msg)
}

// protojsonPos finds protojson's "(line L:C)" in an error message.
var protojsonPos = regexp.MustCompile(`\(line (\d+):(\d+)\)`)

// withContext adds the text around the position protojson reports: the
// JSON was converted from YAML, so its line and column point nowhere the
// user can see, but the surrounding keys do.
func withContext(err error, data []byte) error {
	m := protojsonPos.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	line, _ := strconv.Atoi(m[1])
	col, _ := strconv.Atoi(m[2])
	lines := bytes.Split(data, []byte("\n"))
	if line < 1 || line > len(lines) {
		return err
	}
	l := lines[line-1]
	at := min(max(col-1, 0), len(l))
	from, to := max(at-80, 0), min(at+40, len(l))
	return fmt.Errorf("%w, near: …%s⟨here⟩%s…", err, l[from:at], l[at:to])
}

func validateEnvoy(where string, msg proto.Message) error {
	if v, ok := msg.(validatorAll); ok {
		if err := v.ValidateAll(); err != nil {
			return fieldErr(where, err)
		}
	}
	return nil
}

// DecodeEnvoyYAML is DecodeEnvoyJSON for YAML (anchors allowed, duplicate keys not).
func DecodeEnvoyYAML(where string, data []byte, msg proto.Message) error {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return fieldErr(where, err)
	}
	return DecodeEnvoyJSON(where, js, msg)
}

func checkBootstrap(name string, data []byte) (*Result, error) {
	var b bootstrapv3.Bootstrap
	if err := DecodeEnvoyYAML(name, data, &b); err != nil {
		return nil, err
	}
	plugins, err := WasmPlugins(name+":", &b)
	if err != nil {
		return nil, err
	}
	return &Result{File: name, Envoy: []EnvoyResource{{Where: name, Message: &b}}, Plugins: plugins}, nil
}

// WasmPlugins walks msg, looking inside every typed_config, and returns each
// Wasm PluginConfig it holds with its plugin configuration.
func WasmPlugins(where string, msg proto.Message) ([]Plugin, error) {
	var out []Plugin
	err := walkWasm(where, msg.ProtoReflect(), func(at string, pc *wasmv3.PluginConfig) error {
		cfg, err := pluginConfiguration(pc.GetConfiguration())
		if err != nil {
			return fieldErr(at+".configuration", err)
		}
		p := Plugin{Where: at, RootID: pc.GetRootId(), VMID: pc.GetVmConfig().GetVmId(), Config: cfg,
			HostEnvKeys: pc.GetVmConfig().GetEnvironmentVariables().GetHostEnvKeys()}
		if w := pc.GetAllowOnHeadersStopIteration(); w != nil {
			v := w.GetValue()
			p.AllowOnHeadersStopIteration = &v
		}
		out = append(out, p)
		return nil
	})
	return out, err
}

// pluginConfiguration returns the bytes Envoy hands the plugin: the string or
// bytes of a wrapper as they are, a Struct serialized as JSON.
func pluginConfiguration(a *anypb.Any) ([]byte, error) {
	if a == nil {
		return nil, nil
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		return nil, err
	}
	switch v := m.(type) {
	case *wrapperspb.StringValue:
		return []byte(v.GetValue()), nil
	case *wrapperspb.BytesValue:
		return v.GetValue(), nil
	case *structpb.Struct:
		return protojson.Marshal(v)
	default:
		return nil, fmt.Errorf("plugin configuration of type %s: Envoy passes only StringValue, BytesValue or Struct", a.GetTypeUrl())
	}
}

func walkWasm(where string, m protoreflect.Message, visit func(string, *wasmv3.PluginConfig) error) error {
	switch v := m.Interface().(type) {
	case *wasmv3.PluginConfig:
		return visit(where, v)
	case *anypb.Any:
		inner, err := v.UnmarshalNew()
		if err != nil {
			return fieldErr(where, err)
		}
		return walkWasm(where, inner.ProtoReflect(), visit)
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, val protoreflect.Value) bool {
		name := string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			val.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				err = walkWasm(fmt.Sprintf("%s[%s]", child(where, name), k.String()), mv.Message(), visit)
				return err == nil
			})
		case fd.IsList():
			if fd.Message() == nil {
				return true
			}
			l := val.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = walkWasm(fmt.Sprintf("%s[%d]", child(where, name), i), l.Get(i).Message(), visit)
			}
		case fd.Message() != nil:
			err = walkWasm(child(where, name), val.Message(), visit)
		}
		return err == nil
	})
	return err
}

// child appends a field name to a location: "file: a.b" style.
func child(where, name string) string {
	if strings.HasSuffix(where, ":") {
		return where + " " + name
	}
	return where + "." + name
}
