package openai

import (
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/openai/openaitest"
)

// shapeSlot is a place in a request body where a unit can repeat: the
// body is head, then the unit repeated with commas, then tail.
type shapeSlot struct {
	name, path, head, tail string
	// unit returns a random unit valid in the slot.
	unit func(r *rand.Rand) string
}

// randString returns a short JSON string of ASCII, escapes and non-ASCII.
func randString(r *rand.Rand) string {
	pieces := []string{"a", "b", "hi", " ", `\n`, `\"`, `\\`, `\u00e9`, `\ud83d\ude00`, "é", "日", "xyzxyzxyz", `\/`, `\t`}
	var b strings.Builder
	b.WriteByte('"')
	for range r.IntN(4) {
		b.WriteString(pieces[r.IntN(len(pieces))])
	}
	b.WriteByte('"')
	return b.String()
}

// randNumber returns a short JSON number.
func randNumber(r *rand.Rand) string {
	return []string{"0", "7", "-1", "12345", "1.5", "1e9", "-0.25e-3", "100000000000"}[r.IntN(8)]
}

// ws returns nothing or a little whitespace.
func ws(r *rand.Rand) string {
	if r.IntN(4) > 0 {
		return ""
	}
	return []string{" ", "\n", "\t", "  \n  "}[r.IntN(4)]
}

// randValue returns a random small JSON value of at most depth levels.
func randValue(r *rand.Rand, depth int) string {
	k := r.IntN(8)
	if depth <= 0 && k >= 5 {
		k = r.IntN(5)
	}
	switch k {
	case 0:
		return randString(r)
	case 1:
		return randNumber(r)
	case 2:
		return []string{"true", "false", "null"}[r.IntN(3)]
	case 3, 4:
		return randString(r)
	case 5:
		var b strings.Builder
		b.WriteByte('[')
		for i := range r.IntN(4) {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(ws(r) + randValue(r, depth-1) + ws(r))
		}
		b.WriteByte(']')
		return b.String()
	default:
		var b strings.Builder
		b.WriteByte('{')
		for i := range r.IntN(4) {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(ws(r) + randKey(r) + ws(r) + ":" + ws(r) + randValue(r, depth-1) + ws(r))
		}
		b.WriteByte('}')
		return b.String()
	}
}

// randKey returns a key, often one the parser reads somewhere.
func randKey(r *rand.Rand) string {
	keys := []string{`"k"`, `"role"`, `"content"`, `"text"`, `"type"`, `"model"`, `"prompt"`, `"messages"`, `"name"`, `"tool_calls"`, `"a\u0062"`, `"ab"`, `"x"`}
	if r.IntN(3) == 0 {
		return randString(r)
	}
	return keys[r.IntN(len(keys))]
}

// shapeSlots are the places a unit repeats in the search.
var shapeSlots = []shapeSlot{
	{"unused-member", "/v1/completions", `{"model":"m","prompt":"p",`, `}`, func(r *rand.Rand) string {
		return randKey(r) + ":" + ws(r) + randValue(r, 2)
	}},
	{"unused-element", "/v1/completions", `{"model":"m","prompt":"p","x":[`, `]}`, func(r *rand.Rand) string { return ws(r) + randValue(r, 3) }},
	{"prompt-strings", "/v1/completions", `{"model":"m","prompt":["p",`, `]}`, func(r *rand.Rand) string { return ws(r) + randString(r) }},
	{"prompt-batches", "/v1/completions", `{"model":"m","prompt":[[1],`, `]}`, func(r *rand.Rand) string {
		var b strings.Builder
		b.WriteByte('[')
		for i := range 1 + r.IntN(3) {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(ws(r) + strconv.Itoa([]int{0, 7, 99, 1000, 65536}[r.IntN(5)]))
		}
		b.WriteByte(']')
		return b.String()
	}},
	{"messages", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"p"},`, `]}`, func(r *rand.Rand) string {
		members := []string{`"role":"user"`, `"content":` + randString(r)}
		for range r.IntN(3) {
			members = append(members, randKey(r)+":"+randValue(r, 1))
		}
		if r.IntN(3) == 0 {
			members[1] = `"content":[{"type":"text","text":` + randString(r) + `}]`
		}
		if r.IntN(4) == 0 {
			members = append(members, `"tool_calls":[{"id":`+randString(r)+`,"function":{"name":`+randString(r)+`,"arguments":`+randString(r)+`}}]`)
		}
		r.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
		return "{" + strings.Join(members, ",") + "}"
	}},
	{"parts", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"p"},`, `]}]}`, func(r *rand.Rand) string {
		switch r.IntN(3) {
		case 0:
			return `{"type":"text","text":` + randString(r) + `}`
		case 1:
			return `{"type":"image_url","image_url":{"url":` + randString(r) + `}}`
		default:
			return `{"text":` + randString(r) + `,"type":"text",` + randKey(r) + `:` + randValue(r, 1) + `}`
		}
	}},
}

// TestBodyShapeSearch searches, natively, for the body shape with the
// highest parse cost per byte relative to plain text: random units of
// small JSON values in each slot of shapeSlots, each repeated through a
// 1 MiB body (so that the read budget cuts it, as it cuts the benchmarks'
// bodies), timed against a plain-text body in the same loop. It prints
// the costliest units; the worst is "searched-worst" in bodyShapes, which
// BenchmarkBodyShapesInWasm measures in the Wasm host (native costs rank
// shapes, the Wasm host's differ). Set KVROUTE_SHAPE_SEARCH to a number of
// candidates to run it (about 20 ms each).
//
//	KVROUTE_SHAPE_SEARCH=3000 go test ./openai -run BodyShapeSearch -v
func TestBodyShapeSearch(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KVROUTE_SHAPE_SEARCH"))
	if n <= 0 {
		t.Skip("set KVROUTE_SHAPE_SEARCH=<candidates> to search")
	}
	const size = 1 << 20
	p := newParser(t, `{}`)
	// cost returns the best of a few parses' time per byte of body.
	cost := func(body []byte, path string) (float64, bool) {
		best := time.Duration(1 << 62)
		for range 5 {
			start := time.Now()
			if _, err := p.Parse(body, EndpointOf(path)); err != nil {
				return 0, false
			}
			if d := time.Since(start); d < best {
				best = d
			}
		}
		return float64(best) / float64(len(body)), true
	}
	text := []byte(openaitest.Shapes[0].Body(size, 0))
	type found struct {
		slot, unit string
		x          float64
	}
	var all []found
	r := rand.New(rand.NewPCG(1, 2))
	for range n {
		s := shapeSlots[r.IntN(len(shapeSlots))]
		u := s.unit(r)
		body := []byte(openaitest.Fill(size, s.head, u, ",", s.tail))
		c, ok := cost(body, s.path)
		if !ok {
			continue
		}
		base, _ := cost(text, openaitest.Shapes[0].Path)
		all = append(all, found{s.name, u, c / base})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].x > all[j].x })
	for i := range min(20, len(all)) {
		t.Logf("%6.1fx %-14s %s", all[i].x, all[i].slot, all[i].unit)
	}
	if len(all) == 0 {
		t.Fatal("no candidate parsed")
	}
}
