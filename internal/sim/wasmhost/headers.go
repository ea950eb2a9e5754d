package wasmhost

import "strings"

// headerMap is an ordered, lower-cased header list: the one map object Envoy
// hands to every filter of a stream for one direction.
type headerMap struct{ pairs []Pair }

func (m *headerMap) get(key string) (string, bool) {
	key = strings.ToLower(key)
	for _, p := range m.pairs {
		if p.Key == key {
			return p.Value, true
		}
	}
	return "", false
}

func (m *headerMap) add(key, value string) {
	m.pairs = append(m.pairs, Pair{strings.ToLower(key), value})
}

// replace sets key to one value: the first occurrence keeps its position,
// later ones are removed (Envoy's setCopy).
func (m *headerMap) replace(key, value string) {
	key = strings.ToLower(key)
	out := m.pairs[:0]
	found := false
	for _, p := range m.pairs {
		if p.Key == key {
			if found {
				continue
			}
			found = true
			p.Value = value
		}
		out = append(out, p)
	}
	m.pairs = out
	if !found {
		m.pairs = append(m.pairs, Pair{key, value})
	}
}

func (m *headerMap) remove(key string) {
	key = strings.ToLower(key)
	out := m.pairs[:0]
	for _, p := range m.pairs {
		if p.Key != key {
			out = append(out, p)
		}
	}
	m.pairs = out
}

func (m *headerMap) set(pairs []Pair) {
	m.pairs = m.pairs[:0]
	for _, p := range pairs {
		m.add(p.Key, p.Value)
	}
}

// byteSize is Envoy's HeaderMap::byteSize: the sum of key and value lengths.
func (m *headerMap) byteSize() int {
	n := 0
	for _, p := range m.pairs {
		n += len(p.Key) + len(p.Value)
	}
	return n
}
