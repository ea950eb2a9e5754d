package openai

import (
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// object must read every object as the member-by-member walk does: the
// same value for each name of the set (the first or the last of that
// name, by its written or decoded key as the set says), the same count of
// names past out, a plain flag only on values whose text is their bytes,
// and the end of the object; whatever the spacing, escapes, key lengths
// (up to and past the 8 and 16 bytes its word tests read) and however
// near the end of the body the object sits.
func TestObjectMatchesTheMemberWalk(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	sets := []struct {
		set   *keySet
		names []string
		out   int
	}{
		{requestKeys, requestFields[:], int(firstClientOnly)},
		{messageKeys, messageFields[:], len(messageFields)},
		{partKeys, partFields[:], len(partFields)},
		{callKeys, []string{"id", "function"}, 2},
		{urlKeys, []string{"url"}, 1},
	}
	// Keys: every name of every set, as written and escaped, and near
	// misses of them (one byte off, one byte longer or shorter).
	var keys []string
	for _, s := range sets {
		for _, n := range s.names {
			keys = append(keys, `"`+n+`"`, `"`+n[:len(n)-1]+`"`, `"`+n[:len(n)-1]+`z"`, `"`+n+`x"`, `"x`+n[1:]+`"`,
				`"`+n[:1]+`\u00`+hexByte(n[1])+n[2:]+`"`, `"`+n[:len(n)-1]+`\u00`+hexByte(n[len(n)-1])+`"`)
		}
	}
	keys = append(keys, `""`, `"k"`, `"\né"`, `"é"`, `"\\"`, `"a\"b"`, `"`+strings.Repeat("long_key_", 5)+`"`)
	// Keys whose first byte to look at starts a \u escape (key's one-pass
	// reading): every name spelled with escapes only, and escapes followed
	// by other escapes, quotes, backslashes, text other than ASCII and
	// runs of plain bytes shorter and longer than a word.
	for _, s := range sets {
		for _, n := range s.names {
			var e strings.Builder
			for k := 0; k < len(n); k++ {
				e.WriteString(`\u00` + hexByte(n[k]))
			}
			keys = append(keys, `"`+e.String()+`"`, `"`+e.String()+`x"`)
		}
	}
	keys = append(keys, `"a\u0062"`, `"\u0041"`, `"a\u0062\""`, `"a\u0062\\\u0063"`, `"a\u0062\n"`, `"a\u0062日本"`,
		`"\u00e9\u00e9"`, `"\uD83D\uDE00"`, `"x\u0062`+strings.Repeat("y", 20)+`\u0063"`, `"x\u0062yyyyyyy\u0063z"`,
		`"x\u0062yyyyyyyy"`, `"`+strings.Repeat("\u0061", 30)+`"`, `"0123456789abcdefgh\u0062"`)
	values := []string{`"u"`, `""`, `"image_url"`, `"0123456789abcdef"`, `"0123456789abcdefg"`, `"\n"`, `"a\"b"`, `"日本"`,
		`"\ud83d\ude00a"`, `"a\\"`, `"\\\""`, `"\n12345678\t"`, `"\n123456789\t"`,
		`"` + strings.Repeat("x", 70) + `"`, `"` + strings.Repeat("\\n", 40) + `"`,
		`"{\"city\": \"Paris\", \"unit\": \"celsius\"}"`, `"{\"temperature\": 21, \"sky\": \"clear\", \"wind_kmh\": 12}"`,
		`0`, `-1`, `12.5e3`, `true`, `false`, `null`, `{}`, `[]`, `{"url":"u"}`, `[1,{"a":[]}]`, `{ }`, `[ ]`}
	ws := func() string { return []string{"", "", "", " ", "\n\t", "  "}[rng.Intn(6)] }
	for trial := 0; trial < 20000; trial++ {
		var sb strings.Builder
		sb.WriteString("{" + ws())
		for m, n := 0, rng.Intn(6); m < n; m++ {
			if m > 0 {
				sb.WriteString("," + ws())
			}
			sb.WriteString(keys[rng.Intn(len(keys))] + ws() + ":" + ws() + values[rng.Intn(len(values))] + ws())
		}
		sb.WriteString("}")
		obj := sb.String()
		// The object inside a body, followed by 0 to 60 bytes.
		body := []byte(`{"o":` + obj + `}` + strings.Repeat(" ", rng.Intn(60)))
		var spans jsonSpans
		if !scanJSON(body, &spans) {
			t.Fatalf("test body is not JSON: %s", body)
		}
		at := len(`{"o":`)
		s := sets[rng.Intn(len(sets))]

		// The reference: member by member, keys decoded by text.
		ref := &jsonDoc{jsonSpans: spans, base: cap(body)}
		want := make([][]byte, s.out)
		wantOther := 0
		for i := SkipSpace(body, at+1); ; {
			k, v, next, ok := ref.member(body, i)
			if !ok {
				break
			}
			i = next
			f := slices.Index(s.names, unsafeString(k[1:len(k)-1]))
			if f < 0 && s.set.decoded != 0 {
				if f = slices.Index(s.names, ref.text(k)); f >= 0 && s.set.decoded>>f&1 == 0 {
					f = -1
				}
			}
			switch {
			case f >= s.out:
				wantOther++
			case f >= 0 && (want[f] == nil || s.set.first>>f&1 == 0):
				want[f] = v
			}
		}

		d := &jsonDoc{jsonSpans: spans, base: cap(body)}
		found := make([]valueSpan, s.out)
		end, plain, other := d.object(body[:len(body)], at, s.set, found)
		if end != at+len(obj) || other != wantOther {
			t.Fatalf("%s in %q: end %d, %d others; want %d, %d", s.names, body, end, other, at+len(obj), wantOther)
		}
		got := make([][]byte, s.out)
		for f, sp := range found {
			if sp.e != 0 {
				got[f] = sp.in(body)
			}
		}
		for f := range got {
			if string(got[f]) != string(want[f]) || (got[f] == nil) != (want[f] == nil) {
				t.Fatalf("%s in %q: %s = %q, want %q", s.names, body, s.names[f], got[f], want[f])
			}
			if plain>>f&1 != 0 && (got[f][0] != '"' || strings.ContainsRune(string(got[f]), '\\') || d.str(got[f], true) != ref.text(got[f])) {
				t.Fatalf("%s in %q: %s = %q is not plain", s.names, body, s.names[f], got[f])
			}
		}
	}
}

// object reads a string value with escapes on its fast path when up to
// two escapes, each followed by up to 8 plain bytes, end it: the value it
// finds, and its text, must be gjson's for every such string and its
// near misses (a quote escaped right before the closing one, escaped
// backslashes before it, a third escape, plain runs of 8 and 9 bytes), as
// the first, a middle and the last member, duplicated, and however near
// the end of the body the object sits; and a key spelled with escapes
// names a member only for the names a set matches decoded.
func TestObjectReadsEscapedValues(t *testing.T) {
	values := []string{`"\\"`, `"a\\"`, `"a\""`, `"\""`, `"\"\\"`, `"\\\""`, `"\\\\"`, `"\n日"`, `"\u00e9"`,
		`"\ud83d\ude00"`, `"\ud83d\ude00a"`, `"\ud83d\ude00\n"`, `"x\n\t\r"`, `"\n12345678\n"`, `"\n123456789\n"`,
		`"\n12345678\n12345678"`, `"\n12345678\n123456789"`, `"\n\"12345678"`, `"\u4f60\u597d"`, `"\u4f60\u597d\uff0c"`,
		`"日本\n"`, `"0123456789abcdef\n"`, `"0123456789abcde\"\\"`, `"\/\/é"`, `"0123456789abcdef\n12345678\n12345678"`, `"` + strings.Repeat(`\n`, 30) + `"`,
		`"` + strings.Repeat(`\n`, 31) + `"`, `"` + strings.Repeat(`\u00e9`, 11) + `"`}
	for _, v := range values {
		if !gjson.Valid(v) {
			t.Fatalf("test value %s is not JSON", v)
		}
		want := gjson.Parse(v).String()
		objs := []string{
			`{"text":` + v + `}`,
			`{"text":` + v + `,"type":"text"}`,
			`{"type":"text","text":` + v + `,"x":1}`,
			`{"type": "text", "text": ` + v + `}`,
			`{"text":"u","type":"text","text":` + v + `}`,       // the last text wins
			`{"text":` + v + `,"type":"text","type":` + v + `}`, // and the last type
			`{"0123456789abcdef": ` + v + `,"text":` + v + `}`,  // the longest key the loop reads
		}
		for _, obj := range objs {
			for pad := 0; pad <= 70; pad++ {
				// Clipped: the word tests read up to cap(body).
				body := slices.Clip([]byte(`{"o":` + obj + `}` + strings.Repeat(" ", pad)))
				var spans jsonSpans
				if !scanJSON(body, &spans) {
					t.Fatalf("test body is not JSON: %s", body)
				}
				d := &jsonDoc{jsonSpans: spans, base: cap(body)}
				var f [len(partFields)]valueSpan
				at := len(`{"o":`)
				end, plain, _ := d.object(body, at, partKeys, f[:])
				if end != at+len(obj) {
					t.Fatalf("object(%s) ends at %d, want %d", obj, end, at+len(obj))
				}
				if got := d.str(f[partText].in(body), plain>>partText&1 != 0); got != want {
					t.Fatalf("object(%s): text %q, gjson %q", obj, got, want)
				}
				// gjson's Get takes the first member of a name, object the
				// last type: the last one's text as gjson reads it.
				var lastType string
				gjson.Parse(obj).ForEach(func(k, val gjson.Result) bool {
					if k.String() == "type" {
						lastType = val.String()
					}
					return true
				})
				got := ""
				if f[partType].e != 0 {
					got = d.str(f[partType].in(body), plain>>partType&1 != 0)
				}
				if got != lastType {
					t.Fatalf("object(%s): type %q, want the last one, %q", obj, got, lastType)
				}
			}
		}
	}
	// Escaped keys: the request's names match decoded, a part's type and
	// text only as written; image_url decoded, and its first member wins.
	cases := []struct {
		set   *keySet
		obj   string
		field int
		want  string // "" for no member found
	}{
		{partKeys, `{"t\u0065xt":"\ud83d\ude00","type":"text"}`, partText, ""},
		{partKeys, `{"t\u0065xt":"\ud83d\ude00","text":"\n\n"}`, partText, "\n\n"},
		{partKeys, `{"image_\u0075rl":"\ud83d\ude00a","image_url":"b"}`, partImage, "😀a"},
		{partKeys, `{"image_url":"\n\"","image_\u0075rl":"b"}`, partImage, "\n\""},
		{requestKeys, `{"m\u006fdel":"\u00e9\n","stream":true}`, fieldModel, "é\n"},
		{requestKeys, `{"model":"a","m\u006fdel":"\\\""}`, fieldModel, `\"`},
		{requestKeys, `{"a\u0062":"\n","\u006d\u006f\u0064\u0065\u006c":"\u00e9"}`, fieldModel, "é"},
		{requestKeys, `{"model":"a","mo\u0064el\u0020":"b","m\u006fdel\n":"c"}`, fieldModel, "a"},
	}
	for _, c := range cases {
		body := []byte(`{"o":` + c.obj + `}` + strings.Repeat(" ", 64))
		var spans jsonSpans
		if !scanJSON(body, &spans) {
			t.Fatalf("test body is not JSON: %s", body)
		}
		d := &jsonDoc{jsonSpans: spans, base: cap(body)}
		out := make([]valueSpan, 64)[:len(partFields)]
		if c.set == requestKeys {
			out = out[:firstClientOnly]
		}
		_, plain, _ := d.object(body, len(`{"o":`), c.set, out)
		got := ""
		if out[c.field].e != 0 {
			got = d.str(out[c.field].in(body), plain>>c.field&1 != 0)
		}
		if got != c.want {
			t.Fatalf("object(%s): %q, want %q", c.obj, got, c.want)
		}
	}
}

func hexByte(c byte) string {
	return string("0123456789abcdef"[c>>4]) + string("0123456789abcdef"[c&15])
}

// appendUnescaped takes escapes that follow one another four at a time:
// runs of every simple escape, broken by \u escapes and plain bytes at
// every offset, must decode as gjson decodes them.
func TestUnescapeRunsOfEscapes(t *testing.T) {
	rng := rand.New(rand.NewSource(8))
	pieces := []string{`\n`, `\"`, `\\`, `\/`, `\b`, `\f`, `\r`, `\t`, `\n`, `\n`, `\u00e9`, `\ud83d\ude00`, "a", "é"}
	for trial := 0; trial < 20000; trial++ {
		var sb strings.Builder
		sb.WriteByte('"')
		for n := rng.Intn(40); n >= 0; n-- {
			sb.WriteString(pieces[rng.Intn(len(pieces))])
		}
		sb.WriteByte('"')
		raw := sb.String()
		want := gjson.Parse(raw).Str
		if got := string(appendUnescaped([]byte("pre"), []byte(raw[1:len(raw)-1]))); got != "pre"+want {
			t.Fatalf("appendUnescaped(%s) = %q, gjson %q", raw, got[3:], want)
		}
	}
}

// appendUnescaped writes \u escapes and plain runs by whole words: runs
// of \u escapes of 1-, 2- and 3-byte characters (lower- and upper-case
// hex), surrogate pairs, lone or badly paired halves (U+FFFD, taking the
// \u escape after a half as gjson does), and plain runs of 0 to 40 bytes
// between them must decode as gjson decodes them, with the string at the
// very end of its buffer (a read past it panics) and after texts of
// every length in a buffer with or without room.
func TestUnescapeWords(t *testing.T) {
	rng := rand.New(rand.NewSource(12))
	escapes := []string{
		`\u0041`, `\u007f`, `\u0000`, `\u00e9`, `\u00C9`, `\u07ff`, `\u0800`, `\u4f60`, `\u597D`, `\uff0c`, `\uFFFF`, `\ue000`,
		`\ud83d\ude00`, `\uD83D\uDE00`, `\udbff\udfff`, `\ud800\udc00`, `\ud83d`, `\ude00`, `\udbff`, `\udc00`,
		`\ud83d\u0041`, `\ud83d\ud83d`, `\ude00\ud83d`, `\ude00\u4f60`, `\n`, `\"`, `\\`, `\t`,
	}
	for trial := 0; trial < 20000; trial++ {
		var sb strings.Builder
		for n := rng.Intn(12); n >= 0; n-- {
			for m := rng.Intn(4); m >= 0; m-- { // a run of escapes
				sb.WriteString(escapes[rng.Intn(len(escapes))])
			}
			if rng.Intn(4) > 0 {
				sb.WriteString("abcdefghijklmnopqrstuvwxyz0123456789ABCDE"[:rng.Intn(18+23*rng.Intn(2))]) // a plain run
			}
		}
		inner := []byte(sb.String())
		want := gjson.Parse(`"` + sb.String() + `"`).Str
		pre := []byte("0123456789abcdef"[:rng.Intn(17)])
		dst := pre
		if rng.Intn(2) == 0 {
			dst = slices.Grow(pre, len(inner)+8)
		}
		if got := string(appendUnescaped(dst, inner)); got != string(pre)+want {
			t.Fatalf("appendUnescaped(%q) = %q, gjson %q", inner, got[len(pre):], want)
		}
	}
}

// decodedName must find the name an escaped key decodes to exactly as
// decoding the key as JSON and looking its text up would, for the names a
// set matches decoded: \u escapes of letters, of '_', of other bytes and
// of runes past ASCII, other escapes, upper-case hex, and keys longer than
// any name.
func TestDecodedNameMatchesDecoding(t *testing.T) {
	rng := rand.New(rand.NewSource(11))
	escape := func(c byte) string {
		switch rng.Intn(5) {
		case 0:
			return `\u00` + strings.ToUpper(hex2(c))
		case 1:
			return `\u00` + hex2(c)
		case 2:
			if rng.Intn(8) == 0 {
				return `\u01` + hex2(c) // another rune whose low byte is c
			}
		}
		return string(c)
	}
	pieces := []string{`\n`, `\/`, `\\`, `\"`, `\u00e9`, `\uD83D\uDE00`, `\u0000`, `\u0100`, `\u0041`, `é`, ` `, `-`, `0`}
	for _, set := range []*keySet{requestKeys, partKeys, callKeys, functionKeys, urlKeys} {
		var names []string
		for _, sl := range set.slots {
			if sl.n > 0 {
				names = append(names, sl.name)
			}
		}
		for range 3000 {
			name := names[rng.Intn(len(names))]
			if rng.Intn(4) == 0 {
				name = strings.ToUpper(name[:1]) + name[1:]
			}
			var b strings.Builder
			for k := 0; k < len(name); k++ {
				if rng.Intn(12) == 0 {
					b.WriteString(pieces[rng.Intn(len(pieces))])
				}
				b.WriteString(escape(name[k]))
			}
			if rng.Intn(6) == 0 {
				b.WriteString(escape("_s"[rng.Intn(2)]))
			}
			raw := b.String()
			text := gjson.Parse(`"` + raw + `"`).String()
			want := -1
			for _, n := range names {
				if n == text {
					if g := set.name([]byte(text+"        "), 0, len(text)); g >= 0 && set.decoded>>g&1 != 0 {
						want = g
					}
				}
			}
			if got := set.decodedName([]byte(raw)); got != want {
				t.Fatalf("decodedName(%q) = %d, want %d (decodes to %q)", raw, got, want, text)
			}
		}
	}
}

func hex2(c byte) string { return string("0123456789abcdef"[c>>4]) + string("0123456789abcdef"[c&15]) }

// shortString steps over escapes whole and goes on by words: strings of
// many escapes (escaped JSON, runs of escaped quotes and backslashes, \u
// escapes) at every length around minSpanString and every distance from
// the end of b end where skipString ends them, or give -1 when they end
// past minSpanString bytes.
func TestShortStringManyEscapes(t *testing.T) {
	rng := rand.New(rand.NewSource(11))
	pieces := []string{`\"`, `\\`, `\n`, `\u00e9`, `\/`, `a`, `bc`, `: `, `日`, `0123456789`}
	for trial := 0; trial < 20000; trial++ {
		var sb strings.Builder
		sb.WriteByte('"')
		for n := rng.Intn(24); n > 0; n-- {
			sb.WriteString(pieces[rng.Intn(len(pieces))])
		}
		sb.WriteByte('"')
		str := sb.String()
		b := []byte(str + []string{"", "}", `, "k": 1}`, strings.Repeat(" ", 9)}[rng.Intn(4)])
		full := skipString(b, 0)
		if full != len(str) {
			t.Fatalf("test string %q: skipString %d", b, full)
		}
		want := full
		if full > minSpanString+1 {
			want = -1
		}
		if got := shortString(b, 0); got != want {
			t.Fatalf("shortString(%q) = %d, want %d", b, got, want)
		}
	}
}
