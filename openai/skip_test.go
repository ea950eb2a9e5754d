package openai

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/openai/openaitest"
)

func TestSkipStructure(t *testing.T) {
	for _, s := range openaitest.Shapes {
		body := s.Body(1<<16, 1)
		for pad := range 9 {
			b := []byte(body + strings.Repeat(" ", pad) + `,"x"]`)
			if e := end0(b, 0); e != len(body) {
				t.Errorf("%s pad %d: end %d, want %d", s.Name, pad, e, len(body))
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	atoms := []string{`"a"`, `"\\"`, `"\""`, `"\\\""`, `"\\\\"`, `"]}"`, `"[{"`, `1`, `null`, `"日\\u00e9"`, `"\\\\\\\\\\\""`, `" \\\\ "`,
		`"` + strings.Repeat("long text ", 5) + `"`, `"` + strings.Repeat(`x\"[{`, 9) + `"`, `"` + strings.Repeat("y", 23) + `\\\\"`, `"` + strings.Repeat(`\\`, 17) + `\""`}
	var gen func(d int) string
	gen = func(d int) string {
		if d > 4 || r.IntN(3) == 0 {
			return atoms[r.IntN(len(atoms))]
		}
		n := r.IntN(5)
		var sb strings.Builder
		obj := r.IntN(2) == 0
		if obj {
			sb.WriteByte('{')
		} else {
			sb.WriteByte('[')
		}
		for k := range n {
			if k > 0 {
				sb.WriteByte(',')
			}
			if obj {
				sb.WriteString(atoms[r.IntN(len(atoms))*0+[]int{0, 1, 2, 3, 4, 5, 6, 9, 10, 11}[r.IntN(10)]] + ":")
			}
			sb.WriteString(gen(d + 1))
		}
		if obj {
			sb.WriteByte('}')
		} else {
			sb.WriteByte(']')
		}
		return sb.String()
	}
	for range 20000 {
		v := gen(0)
		if v[0] != '{' && v[0] != '[' {
			continue
		}
		if !validJSON([]byte(v)) {
			t.Fatalf("generated invalid %s", v)
		}
		pre := strings.Repeat(" ", r.IntN(9))
		b := []byte(pre + v + `]}"x"` + strings.Repeat("[", r.IntN(9)))
		if e := end0(b, len(pre)); e != len(pre)+len(v) {
			t.Fatalf("%q: end %d, want %d", b, e, len(pre)+len(v))
		}
	}
}

func end0(b []byte, i int) int { return structureEnd(b, i, 0, maxNesting) }
