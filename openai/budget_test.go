package openai

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/openai/openaitest"
	"github.com/tidwall/gjson"
)

// A body past the read budget loses nothing on the way to the engine: the
// client-only members go wherever they are and however they are spelt,
// and every other member is forwarded byte for byte, the parts the parser
// left out included.
func TestWithoutClientOnlyOnACutBody(t *testing.T) {
	msgs := openaitest.Fill(1<<20, `[`, `{"role":"user","content":"hi"}`, ",", `]`)
	unused := `{"a":[` + strings.Repeat(`{"b":"}]"},`, 5000) + `1]}`
	body := []byte(`{"kv_transfer_params":{"remote_host":"169.254.169.254"},"model":"m","messages":` + msgs +
		`,"bootstr\u0061p_host":"10.0.0.1","x":` + unused + `,"bootstrap_room":5,"stream":false}`)
	p := newParser(t, `{}`)
	r, err := p.Parse(body, Chat)
	if err != nil {
		t.Fatal(err.Message)
	}
	if len(p.trim.cuts) != 3 || p.trim.removed == 0 {
		t.Fatalf("%d cuts, %d bytes of elements left out: want the messages cut, kv_transfer_params and x left out", len(p.trim.cuts), p.trim.removed)
	}
	if r.ClientOnly != 3 || r.Model != "m" {
		t.Errorf("%d client-only members, model %q; want 3, m", r.ClientOnly, r.Model)
	}
	clean := p.WithoutClientOnly(body)
	var keys []string
	gjson.ParseBytes(clean).ForEach(func(k, v gjson.Result) bool {
		keys = append(keys, k.String())
		return true
	})
	if !slices.Equal(keys, []string{"model", "messages", "x", "stream"}) {
		t.Fatalf("forwarded members %q, want model, messages, x, stream", keys)
	}
	if got := gjson.GetBytes(clean, "messages").Raw; got != msgs {
		t.Errorf("messages forwarded as %d bytes, want the client's %d", len(got), len(msgs))
	}
	if got := gjson.GetBytes(clean, "x").Raw; got != unused {
		t.Errorf("x forwarded as %.40q, want the client's", got)
	}
	// The prompt is read in part: fewer tokens hashed than the body holds,
	// and the rest counted at a character per byte.
	if r.PromptTokens < len(msgs)/5 {
		t.Errorf("prompt tokens %d for %d bytes of messages", r.PromptTokens, len(msgs))
	}
}

// What the budget leaves out is the engine's to check; what it reads and
// the structure around it are kvroute's.
func TestReadBudgetChecks(t *testing.T) {
	many := openaitest.Fill(1<<20, `[`, `{"role":"user","content":"hi"}`, ",", `]`)
	for _, c := range []struct {
		name, body, want string // want: the error, "" for routed
	}{
		{"an unused member that is not JSON inside", `{"model":"m","prompt":"p","x":[{"a":tru}]}`, ""},
		{"messages past the budget that are not messages", `{"model":"m","messages":` + many[:len(many)-1] + `,{"role":7}]}`, ""},
		{"an unused member that does not close", `{"model":"m","prompt":"p","x":[{"a":1}}`, "not valid JSON"},
		{"a bracket too many after a cut", `{"model":"m","messages":` + many + `]}`, "not valid JSON"},
		{"too many top-level members", `{"model":"m","prompt":"p",` + strings.Repeat(`"k":0,`, maxMembers) + `"z":0}`, "more than 4096 top-level members"},
		{"4096 top-level members", `{"model":"m","prompt":"p",` + strings.Repeat(`"k":0,`, maxMembers-3) + `"z":0}`, ""},
		{"nesting past 512", `{"model":"m","prompt":` + strings.Repeat("[", 512) + "1" + strings.Repeat("]", 512) + `}`, "more than 512 deep"},
		{"nesting 512 deep", `{"model":"m","prompt":"p","x":` + strings.Repeat("[", 511) + strings.Repeat("]", 511) + `}`, ""},
		{"nesting 512 deep in a member read", `{"model":"m","messages":[{"role":"user","content":"hi","x":` + strings.Repeat(`{"a":`, 509) + "1" + strings.Repeat("}", 509) + `}]}`, ""},
		{"nesting past 512 in a member read", `{"model":"m","messages":[{"role":"user","content":"hi","x":` + strings.Repeat(`{"a":`, 510) + "1" + strings.Repeat("}", 510) + `}]}`, "more than 512 deep"},
		{"an unused member nested past 512", `{"model":"m","prompt":"p","x":` + strings.Repeat("[", 600000) + strings.Repeat("]", 600000) + `}`, "more than 512 deep"},
		{"a message of too many members", `{"model":"m","messages":[{"role":"user","content":"hi",` + strings.Repeat(`"k":0,`, 40000) + `"z":0}]}`, "objects hold more than"},
	} {
		p, kind := newParser(t, `{}`), Completions
		if strings.Contains(c.body, "messages") {
			kind = Chat
		}
		_, err := p.Parse([]byte(c.body), kind)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Message, c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// FuzzReadBudget reads each valid body under a budget small enough to cut
// it: the view is JSON with the body's top-level members, in order, the
// unused ones' values read as 0 at most; a body the whole reading routes
// is routed under the budget with the same model; and the body forwarded
// without client-only members is the body's other members, byte for byte.
func FuzzReadBudget(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"text","text":"b"}]},{"role":"user","content":"c"}],"x":[1,2],"kv_transfer_params":{}}`), uint8(16))
	f.Add([]byte(`{"model":"m","prompt":[[1,2],[3,4],[5]],"bootstrap_room":1,"y":{"a":[{}]}}`), uint8(16))
	f.Add([]byte(`{"model":"m","prompt":["a\"]","b\\","c"],"tools":[{"type":"function","function":{"name":"f","parameters":{"enum":[1,2,3]}}}]}`), uint8(16))
	whole, small := newParser(f, `{}`), newParser(f, `{}`)
	whole.trim.budget = math.MaxInt / 2
	f.Fuzz(func(t *testing.T, body []byte, budget uint8) {
		if !validJSON(body) || !gjson.ParseBytes(body).IsObject() {
			return
		}
		small.trim.budget = 8 + int(budget)
		view, terr := small.trim.trim(body)
		if terr != nil {
			return
		}
		if !validJSON(view) {
			t.Fatalf("view %q of %q is not JSON", view, body)
		}
		var bk, vk []string
		var bv, vv []string
		gjson.ParseBytes(body).ForEach(func(k, v gjson.Result) bool { bk, bv = append(bk, k.Raw), append(bv, v.Raw); return true })
		gjson.ParseBytes(view).ForEach(func(k, v gjson.Result) bool { vk, vv = append(vk, k.Raw), append(vv, v.Raw); return true })
		if !slices.Equal(bk, vk) {
			t.Fatalf("view %q has members %q, body %q", view, vk, bk)
		}
		for k := range bk {
			if vv[k] != bv[k] && (vv[k] == "0") == routedKey([]byte(bk[k][1:len(bk[k])-1])) {
				t.Fatalf("member %s: %q in the view, %q in the body", bk[k], vv[k], bv[k])
			}
		}
		for _, kind := range []Endpoint{Completions, Chat} {
			rw, werr := whole.Parse(body, kind)
			rs, serr := small.Parse(body, kind)
			if werr == nil && (serr != nil && !strings.Contains(serr.Message, "objects hold more than") || serr == nil && rs.Model != rw.Model) {
				t.Fatalf("%q as %v: the whole body routes (model %q), under a budget of %d: %v (model %q)", body, kind, rw.Model, small.trim.budget, serr, rs.Model)
			}
			if serr != nil {
				continue
			}
			want := []string{}
			gjson.ParseBytes(body).ForEach(func(k, v gjson.Result) bool {
				if fieldOf(k.String(), requestFields[:]) < firstClientOnly {
					want = append(want, k.Raw+":"+v.Raw)
				}
				return true
			})
			clean := small.WithoutClientOnly(body)
			if clean == nil {
				clean = body
			}
			got := []string{}
			gjson.ParseBytes(clean).ForEach(func(k, v gjson.Result) bool { got = append(got, k.Raw+":"+v.Raw); return true })
			if !slices.Equal(got, want) {
				t.Fatalf("%q: forwarded %q, want %q", body, got, want)
			}
		}
	})
}
