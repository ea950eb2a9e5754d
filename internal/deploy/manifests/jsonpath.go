package manifests

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
)

// jsonEntry is one value of a JSON document: its path and the offset of
// its key (or, in a list, of the value).
type jsonEntry struct {
	segs []segment
	off  int
}

// jsonEntries lists every value of a JSON document in document order. On
// malformed JSON it returns what it read.
func jsonEntries(data []byte) []jsonEntry {
	dec := json.NewDecoder(bytes.NewReader(data))
	var out []jsonEntry
	var walk func(segs []segment) error
	walk = func(segs []segment) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		d, ok := tok.(json.Delim)
		if !ok {
			return nil
		}
		switch d {
		case '{':
			for dec.More() {
				off := int(dec.InputOffset())
				k, err := dec.Token()
				if err != nil {
					return err
				}
				ks, _ := k.(string)
				child := append(append([]segment(nil), segs...), segment{key: ks})
				out = append(out, jsonEntry{segs: child, off: skipSpace(data, off)})
				if err := walk(child); err != nil {
					return err
				}
			}
		case '[':
			for i := 0; dec.More(); i++ {
				off := int(dec.InputOffset())
				child := append(append([]segment(nil), segs...), segment{idx: i, isIndex: true})
				out = append(out, jsonEntry{segs: child, off: skipSpace(data, off)})
				if err := walk(child); err != nil {
					return err
				}
			}
		}
		_, err = dec.Token() // the closing delimiter
		return err
	}
	if err := walk(nil); err != nil && !errors.Is(err, io.EOF) {
		return out
	}
	return out
}

// skipSpace moves off past the separators the decoder has not consumed.
func skipSpace(data []byte, off int) int {
	for off < len(data) && strings.IndexByte(" \t\r\n,:", data[off]) >= 0 {
		off++
	}
	return off
}

// pathAt returns the path of the value at or before offset off.
func pathAt(data []byte, off int) []segment {
	var best []segment
	for _, e := range jsonEntries(data) {
		if e.off > off {
			break
		}
		best = e.segs
	}
	return best
}

// renderPath writes segments in the a.b[0].c notation.
func renderPath(segs []segment) string {
	p := ""
	for _, s := range segs {
		if s.isIndex {
			p = index(p, s.idx)
		} else {
			p = key(p, s.key)
		}
	}
	return p
}

// removeAt returns data without the value at segs (numbers kept exactly),
// or false when there is no such value.
func removeAt(data []byte, segs []segment) ([]byte, bool) {
	if len(segs) == 0 {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, false
	}
	parent := doc
	for _, s := range segs[:len(segs)-1] {
		switch v := parent.(type) {
		case map[string]any:
			parent = v[s.key]
		case []any:
			if !s.isIndex || s.idx >= len(v) {
				return nil, false
			}
			parent = v[s.idx]
		default:
			return nil, false
		}
	}
	last := segs[len(segs)-1]
	switch v := parent.(type) {
	case map[string]any:
		if _, ok := v[last.key]; !ok || last.isIndex {
			return nil, false
		}
		delete(v, last.key)
	case []any:
		if !last.isIndex || last.idx >= len(v) {
			return nil, false
		}
		// Keep the indexes of the following elements: replace, not delete.
		v[last.idx] = map[string]any{}
	default:
		return nil, false
	}
	out, err := json.Marshal(doc)
	return out, err == nil
}
