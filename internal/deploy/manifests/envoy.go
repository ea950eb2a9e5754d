package manifests

import (
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
	// Doc and Path locate it in the file (the patch value, the policy).
	Doc  int
	Path string
}

// fieldProblem is a problem at a path relative to a decoded value.
type fieldProblem struct{ path, msg string }

// maxDecodeProblems bounds the decode-and-retry loop of decodeProto.
const maxDecodeProblems = 50

// protojsonPos finds protojson's "(line L:C)" and the prefix around it.
var protojsonPos = regexp.MustCompile(`^proto:\s*(.*?)\s*\(line (\d+):(\d+)\):\s*`)

// decodeProto decodes JSON into msg the strict way (unknown fields and
// unresolvable typed_config types fail) and finds every such problem, not
// only the first: after each error the offending value is removed and the
// decode retried. msg holds what decoded.
func decodeProto(js []byte, msg proto.Message) []fieldProblem {
	var out []fieldProblem
	var last []segment
	for range maxDecodeProblems {
		proto.Reset(msg)
		err := protojson.Unmarshal(js, msg)
		if err == nil {
			return out
		}
		m := protojsonPos.FindStringSubmatch(err.Error())
		if m == nil {
			return append(out, fieldProblem{"", err.Error()})
		}
		col, _ := strconv.Atoi(m[3])
		line, _ := strconv.Atoi(m[2])
		segs := []segment(nil)
		if line == 1 { // JSON converted from YAML is one line: the column is the offset
			segs = pathAt(js, col-1)
		}
		text := strings.TrimSpace(m[1] + " " + err.Error()[len(m[0]):])
		if len(last) > 0 && segsPrefix(segs, last) && len(segs) <= len(last) {
			// Removing the value did not help (a list element, an Any
			// without its type): remove its parent.
			segs = last[:len(last)-1]
		} else {
			out = append(out, fieldProblem{renderPath(segs), text})
		}
		next, ok := removeAt(js, segs)
		if !ok {
			proto.Reset(msg)
			return out
		}
		js, last = next, segs
	}
	return out
}

// validatorAll is what protoc-gen-validate generates on every Envoy message.
type validatorAll interface{ ValidateAll() error }

// pgvError is one protoc-gen-validate violation, and pgvMulti what
// ValidateAll returns.
type (
	pgvError interface {
		Field() string
		Reason() string
		Cause() error
	}
	pgvMulti interface{ AllErrors() []error }
)

// validateProto runs protoc-gen-validate's ValidateAll, the rules Envoy
// itself enforces, on msg and on every message inside its Any fields (which
// ValidateAll does not enter, and Envoy validates when it loads each
// typed_config), and returns each violation at its field path.
func validateProto(msg proto.Message) []fieldProblem {
	var out []fieldProblem
	var walk func(m protoreflect.Message, path string, validate bool)
	walk = func(m protoreflect.Message, path string, validate bool) {
		if a, ok := m.Interface().(*anypb.Any); ok {
			inner, err := a.UnmarshalNew()
			if err != nil {
				out = append(out, fieldProblem{path, err.Error()})
				return
			}
			walk(inner.ProtoReflect(), path, true)
			return
		}
		if v, ok := m.Interface().(validatorAll); ok && validate {
			if err := v.ValidateAll(); err != nil {
				pgvProblems(err, m, path, &out)
			}
		}
		// Look for Any fields below; ValidateAll covered the rest.
		eachMessage(m, path, func(child protoreflect.Message, at string) { walk(child, at, false) })
	}
	walk(msg.ProtoReflect(), "", true)
	return out
}

// eachMessage calls fn with every message-valued field of m (list elements
// and map values included) and its path.
func eachMessage(m protoreflect.Message, path string, fn func(protoreflect.Message, string)) {
	m.Range(func(fd protoreflect.FieldDescriptor, val protoreflect.Value) bool {
		name := string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				val.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					fn(mv.Message(), key(key(path, name), k.String()))
					return true
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				for i := 0; i < val.List().Len(); i++ {
					fn(val.List().Get(i).Message(), index(key(path, name), i))
				}
			}
		case fd.Message() != nil:
			fn(val.Message(), key(path, name))
		}
		return true
	})
}

// pgvField splits protoc-gen-validate's field name: "Clusters[0]", "Name", "Map[key]".
var pgvField = regexp.MustCompile(`^([A-Za-z0-9_]+)(?:\[(.*)\])?$`)

// pgvProblems turns a ValidateAll error tree into problems, translating the
// Go field names it reports into the proto names the file uses.
func pgvProblems(err error, m protoreflect.Message, path string, out *[]fieldProblem) {
	if me, ok := err.(pgvMulti); ok {
		for _, e := range me.AllErrors() {
			pgvProblems(e, m, path, out)
		}
		return
	}
	fe, ok := err.(pgvError)
	if !ok {
		*out = append(*out, fieldProblem{path, err.Error()})
		return
	}
	parts := pgvField.FindStringSubmatch(fe.Field())
	var fd protoreflect.FieldDescriptor
	if parts != nil {
		fields := m.Descriptor().Fields()
		for i := 0; i < fields.Len(); i++ {
			f := fields.Get(i)
			if strings.EqualFold(strings.ReplaceAll(string(f.Name()), "_", ""), strings.ReplaceAll(parts[1], "_", "")) {
				fd = f
			}
		}
	}
	if fd == nil {
		*out = append(*out, fieldProblem{path, fe.Field() + ": " + fe.Reason()})
		return
	}
	at := key(path, string(fd.Name()))
	var child protoreflect.Message
	switch {
	case fd.IsList() && parts[2] != "":
		i, _ := strconv.Atoi(parts[2])
		at = index(at, i)
		if l := m.Get(fd).List(); fd.Message() != nil && i < l.Len() {
			child = l.Get(i).Message()
		}
	case fd.IsMap() && parts[2] != "":
		at = key(at, parts[2])
		if fd.MapValue().Message() != nil {
			m.Get(fd).Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				if k.String() == parts[2] {
					child = v.Message()
				}
				return true
			})
		}
	case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
		child = m.Get(fd).Message()
	}
	if fe.Cause() != nil && child != nil {
		pgvProblems(fe.Cause(), child, at, out)
		return
	}
	msg := fe.Reason()
	if fe.Cause() != nil {
		msg += ": " + fe.Cause().Error()
	}
	*out = append(*out, fieldProblem{at, msg})
}

// envoyProblems decodes and validates an Envoy message, every problem
// relative to the value's own path.
// What decoded after the bad values were removed is validated too, except
// where a value was removed (its absence is not a second problem).
func envoyProblems(js []byte, msg proto.Message) []fieldProblem {
	probs := decodeProto(js, msg)
	decoded := len(probs)
	for _, v := range validateProto(msg) {
		under := false
		for _, d := range probs[:decoded] {
			under = under || v.path == d.path || strings.HasPrefix(v.path, d.path+".") || strings.HasPrefix(d.path, v.path+".")
		}
		if !under {
			probs = append(probs, v)
		}
	}
	return probs
}

// DecodeEnvoyJSON decodes data into msg the strict way and runs the
// validation Envoy runs (see envoyProblems); the error lists every problem.
func DecodeEnvoyJSON(where string, data []byte, msg proto.Message) error {
	probs := envoyProblems(data, msg)
	if len(probs) == 0 {
		return nil
	}
	var ps Problems
	for _, p := range probs {
		ps = append(ps, Problem{File: where, Path: p.path, Msg: p.msg})
	}
	return ps
}

// DecodeEnvoyYAML is DecodeEnvoyJSON for YAML (anchors allowed, duplicate keys not).
func DecodeEnvoyYAML(where string, data []byte, msg proto.Message) error {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return Problems{{File: where, Line: yamlErrLine(err), Msg: err.Error()}}
	}
	return DecodeEnvoyJSON(where, js, msg)
}

// yamlLine finds the line number in a YAML parser's message.
var yamlLine = regexp.MustCompile(`line (\d+)`)

func yamlErrLine(err error) int {
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return 0
}

func checkBootstrap(r *report, data []byte) *Result {
	res := &Result{File: r.file}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		r.probs = append(r.probs, Problem{File: r.file, Line: yamlErrLine(err), Msg: err.Error()})
		return res
	}
	var b bootstrapv3.Bootstrap
	for _, p := range envoyProblems(js, &b) {
		r.add(0, p.path, "%s", p.msg)
	}
	res.Envoy = []EnvoyResource{{Where: r.file, Message: &b}}
	res.Plugins = r.wasmPlugins(0, "", &b)
	return res
}

// wasmPlugins returns each Wasm PluginConfig inside msg (looking inside
// every typed_config) with its plugin configuration, located at doc and
// base; problems go to r.
func (r *report) wasmPlugins(doc int, base string, msg proto.Message) []Plugin {
	var out []Plugin
	walkWasm(base, msg.ProtoReflect(), func(at string, pc *wasmv3.PluginConfig) {
		cfg, cfgPath, err := pluginConfiguration(pc.GetConfiguration())
		if err != nil {
			r.add(doc, key(at, "configuration"), "%v", err)
			return
		}
		p := Plugin{Where: r.file + ": " + at, Doc: doc, Path: joinField(key(at, "configuration"), cfgPath),
			RootID: pc.GetRootId(), VMID: pc.GetVmConfig().GetVmId(), Config: cfg,
			HostEnvKeys: pc.GetVmConfig().GetEnvironmentVariables().GetHostEnvKeys()}
		if w := pc.GetAllowOnHeadersStopIteration(); w != nil {
			v := w.GetValue()
			p.AllowOnHeadersStopIteration = &v
		}
		out = append(out, p)
	})
	return out
}

// PluginConfiguration returns the bytes Envoy hands the plugin: the string or
// bytes of a wrapper as they are, a Struct serialized as JSON.
func PluginConfiguration(a *anypb.Any) ([]byte, error) {
	cfg, _, err := pluginConfiguration(a)
	return cfg, err
}

// pluginConfiguration is PluginConfiguration, with the path of the
// configuration inside the Any's JSON form ("value" for each type).
func pluginConfiguration(a *anypb.Any) ([]byte, string, error) {
	if a == nil {
		return nil, "", nil
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		return nil, "", err
	}
	switch v := m.(type) {
	case *wrapperspb.StringValue:
		return []byte(v.GetValue()), "value", nil
	case *wrapperspb.BytesValue:
		return v.GetValue(), "value", nil
	case *structpb.Struct:
		js, err := protojson.Marshal(v)
		return js, "value", err
	default:
		return nil, "", fmt.Errorf("plugin configuration of type %s: Envoy passes only StringValue, BytesValue or Struct", a.GetTypeUrl())
	}
}

func walkWasm(where string, m protoreflect.Message, visit func(string, *wasmv3.PluginConfig)) {
	switch v := m.Interface().(type) {
	case *wasmv3.PluginConfig:
		visit(where, v)
		return
	case *anypb.Any:
		inner, err := v.UnmarshalNew()
		if err != nil {
			return // validateProto reported it
		}
		walkWasm(where, inner.ProtoReflect(), visit)
		return
	}
	eachMessage(m, where, func(child protoreflect.Message, at string) { walkWasm(at, child, visit) })
}
