package manifests

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Problem is one thing wrong with a checked file, located the way an editor
// wants it: the line, and the field path inside the YAML document (or JSON
// file) in the file's own key names.
type Problem struct {
	File string
	// Line is 1-based; 0 when the problem has no better place than the file.
	Line int
	// Path is the field path in the document: "spec.configPatches[0].patch.value",
	// continuing into embedded plugin configuration JSON ("...configuration.value.endpoints[1]").
	Path string
	Msg  string
	// doc is the index of the document among the file's non-empty YAML documents.
	doc int
}

// String is "file:line: path: message", the form compilers and editors use.
func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		b.WriteString(":" + strconv.Itoa(p.Line))
	}
	b.WriteString(": ")
	if p.Path != "" {
		b.WriteString(p.Path + ": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Problems is every problem found in one or more files; as an error it
// prints one per line.
type Problems []Problem

func (ps Problems) Error() string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, "\n")
}

// report collects the problems of one file.
type report struct {
	file  string
	probs Problems
}

// add records a problem at a field path of document doc.
func (r *report) add(doc int, path, format string, args ...any) {
	r.probs = append(r.probs, Problem{File: r.file, Path: path, Msg: fmt.Sprintf(format, args...), doc: doc})
}

// addErr records err at path; a Problems or a filter configuration error
// list is spread, each problem under path.
func (r *report) addErr(doc int, path string, err error) {
	var ps Problems
	if errors.As(err, &ps) {
		for _, p := range ps {
			r.probs = append(r.probs, Problem{File: r.file, Path: joinField(path, p.Path), Msg: p.Msg, doc: doc})
		}
		return
	}
	r.add(doc, path, "%s", err.Error())
}

// result returns the problems located in data, ordered by line, or nil.
func (r *report) result(data []byte) error {
	if len(r.probs) == 0 {
		return nil
	}
	l := newLocator(data)
	for i := range r.probs {
		if r.probs[i].Line == 0 {
			r.probs[i].Line = l.line(r.probs[i].doc, r.probs[i].Path)
		}
	}
	sort.SliceStable(r.probs, func(i, j int) bool { return r.probs[i].Line < r.probs[j].Line })
	// One text can be checked several times (a YAML anchor used by three
	// filters, a policy that reaches two listeners): say it once.
	out := r.probs[:0]
	seen := map[string]bool{}
	for _, p := range r.probs {
		k := strconv.Itoa(p.Line) + "\x00" + p.Msg
		if p.Line == 0 {
			k += "\x00" + p.Path
		}
		if !seen[k] {
			seen[k] = true
			out = append(out, p)
		}
	}
	r.probs = out
	return r.probs
}

// has reports whether a problem is already recorded at path or below it.
func (r *report) has(doc int, path string) bool {
	for _, p := range r.probs {
		if p.doc == doc && (p.Path == path || strings.HasPrefix(p.Path, path+".") || strings.HasPrefix(p.Path, path+"[")) {
			return true
		}
	}
	return false
}

// pathErr is an error at a field path, for helpers that run without a report.
func pathErr(path string, err error) error { return Problems{{Path: path, Msg: err.Error()}} }

// joinField appends a relative field path to a base one.
func joinField(base, rel string) string {
	switch {
	case base == "":
		return rel
	case rel == "":
		return base
	case strings.HasPrefix(rel, "["):
		return base + rel
	}
	return base + "." + rel
}

// key renders one map key as a path element: bare when it is a plain
// identifier, ["quoted"] otherwise (addresses, names with dots or slashes).
func key(base, k string) string {
	if k != "" && strings.IndexFunc(k, func(r rune) bool { return r == '.' || r == '[' || r == ']' || r == ' ' || r == '"' }) < 0 {
		return joinField(base, k)
	}
	return base + "[" + strconv.Quote(k) + "]"
}

// index renders a list element.
func index(base string, i int) string { return base + "[" + strconv.Itoa(i) + "]" }

// segment is one step of a field path: a key, or a list index (key == "" and isIndex).
type segment struct {
	key     string
	idx     int
	isIndex bool
}

var pathToken = regexp.MustCompile(`\[("(?:[^"\\]|\\.)*"|\d+)\]|[^.\[]+`)

// splitPath parses a path rendered by key and index (or by the Kubernetes
// and protobuf decoders, which use the same a.b[0].c notation).
func splitPath(p string) []segment {
	var out []segment
	for _, m := range pathToken.FindAllStringSubmatch(p, -1) {
		switch {
		case m[1] == "":
			out = append(out, segment{key: m[0]})
		case m[1][0] == '"':
			k, err := strconv.Unquote(m[1])
			if err != nil {
				k = m[1]
			}
			out = append(out, segment{key: k})
		default:
			n, _ := strconv.Atoi(m[1])
			out = append(out, segment{idx: n, isIndex: true})
		}
	}
	return out
}

// locator finds the line of a field path in a file's YAML documents. JSON
// is YAML, so plugin configuration files are located the same way; a path
// that continues into a block scalar holding JSON (a plugin configuration
// embedded as a string) is followed into the JSON.
type locator struct{ docs []*yaml.Node }

func newLocator(data []byte) *locator {
	l := &locator{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for range 10000 {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			break
		}
		if len(n.Content) == 0 || (n.Content[0].Kind == yaml.ScalarNode && n.Content[0].Tag == "!!null") {
			continue // an empty document, which the checks skip too
		}
		l.docs = append(l.docs, &n)
	}
	return l
}

// line returns the line of the deepest node of path that exists, the key's
// line for a mapping entry; 0 when the document is unknown.
func (l *locator) line(doc int, path string) int {
	if doc < 0 || doc >= len(l.docs) {
		return 0
	}
	n := l.docs[doc].Content[0]
	line := n.Line
	segs := splitPath(path)
	for i := 0; i < len(segs); i++ {
		n = deref(n)
		s := segs[i]
		switch {
		case n.Kind == yaml.SequenceNode && s.isIndex:
			if s.idx >= len(n.Content) {
				return line
			}
			n = n.Content[s.idx]
			line = n.Line
		case n.Kind == yaml.SequenceNode && !s.isIndex:
			// A path without the index (encoding/json's type errors): the
			// first element that has the key.
			found := false
			for _, el := range n.Content {
				if el = deref(el); el.Kind == yaml.MappingNode {
					if k, v, used := lookup(el, segs[i:]); v != nil {
						i += used - 1
						n, line, found = v, k.Line, true
						break
					}
				}
			}
			if !found {
				return line
			}
		case n.Kind == yaml.MappingNode && !s.isIndex:
			k, v, used := lookup(n, segs[i:])
			if v == nil {
				return line
			}
			i += used - 1
			n, line = v, k.Line
		case n.Kind == yaml.ScalarNode && n.Style == yaml.LiteralStyle:
			// JSON inside a block scalar: its lines follow the indicator's.
			return n.Line + 1 + jsonLine([]byte(n.Value), segs[i:])
		default:
			return line
		}
	}
	return line
}

func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// lookup finds the entry of mapping m for the first segment(s): keys may
// contain dots (annotations), may be spelled in camelCase where the path
// uses proto names, and may come from a << merge.
func lookup(m *yaml.Node, segs []segment) (k, v *yaml.Node, used int) {
	for j := len(segs); j >= 1; j-- {
		var parts []string
		for _, s := range segs[:j] {
			if s.isIndex {
				break
			}
			parts = append(parts, s.key)
		}
		if len(parts) != j {
			continue
		}
		want := strings.Join(parts, ".")
		if k, v := entry(m, want); v != nil {
			return k, v, j
		}
	}
	return nil, nil, 0
}

func entry(m *yaml.Node, want string) (k, v *yaml.Node) {
	norm := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }
	var loose [2]*yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		key, val := m.Content[i], m.Content[i+1]
		switch {
		case key.Value == "<<":
			for _, src := range mergeSources(val) {
				if k, v := entry(src, want); v != nil {
					loose = [2]*yaml.Node{k, v}
				}
			}
		case key.Value == want:
			return key, val
		case loose[1] == nil && norm(key.Value) == norm(want):
			loose = [2]*yaml.Node{key, val}
		}
	}
	return loose[0], loose[1]
}

func mergeSources(v *yaml.Node) []*yaml.Node {
	v = deref(v)
	if v.Kind == yaml.SequenceNode {
		var out []*yaml.Node
		for _, c := range v.Content {
			out = append(out, deref(c))
		}
		return out
	}
	return []*yaml.Node{v}
}

// jsonLine returns the 0-based line, inside JSON text, of the deepest part
// of path it holds.
func jsonLine(data []byte, segs []segment) int {
	off := 0
	for _, e := range jsonEntries(data) {
		if segsPrefix(e.segs, segs) && len(e.segs) > 0 {
			off = e.off
		}
	}
	return bytes.Count(data[:min(off, len(data))], []byte("\n"))
}

// segsPrefix reports whether a is a prefix of b.
func segsPrefix(a, b []segment) bool {
	if len(a) > len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
