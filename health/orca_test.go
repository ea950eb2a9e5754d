package health

import (
	"math/rand"
	"strconv"
	"strings"
	"testing"
)

func TestParseORCA(t *testing.T) {
	l := ParseORCA("TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=2.0, cpu_utilization=0.3")
	if !l.OK || l.KVUsage != 0.4 || l.Waiting != 2 {
		t.Errorf("text: %+v", l)
	}
	l = ParseORCA(`JSON {"named_metrics":{"kv_cache_usage_perc":0.9,"num_requests_running":7}}`)
	if !l.OK || l.KVUsage != 0.9 || l.Running != 7 {
		t.Errorf("json: %+v", l)
	}
	for _, bad := range []string{"", "TEXT", "TEXT named_metrics.kv_cache_usage_perc=abc", "JSON {", "TEXT named_metrics.kv_cache_usage_perc=7", "BINARY x",
		"TEXT named_metrics.num_requests_waiting=1e300", `JSON {"named_metrics":{"num_requests_running":1e19}}`, "TEXT num_requests_running=-0.5"} {
		if l := ParseORCA(bad); l.OK {
			t.Errorf("%q parsed as %+v", bad, l)
		}
	}
}

// TestParseORCATextMatchesSplit checks the TEXT form's comma walk against
// the strings.Split it replaces, and that it allocates nothing.
func TestParseORCATextMatchesSplit(t *testing.T) {
	split := func(v string) LoadReport {
		var l LoadReport
		v = strings.TrimSpace(v)
		if !strings.HasPrefix(v, "TEXT ") {
			return l
		}
		for _, kv := range strings.Split(v[len("TEXT "):], ",") {
			name, val, found := strings.Cut(strings.TrimSpace(kv), "=")
			if !found {
				continue
			}
			x, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err != nil {
				continue
			}
			l.set(strings.TrimPrefix(strings.TrimSpace(name), "named_metrics."), x)
		}
		return l
	}
	rng := rand.New(rand.NewSource(1))
	parts := []string{"named_metrics.kv_cache_usage_perc=0.4", "kv_cache_usage_perc=1.5", " named_metrics.num_requests_waiting = 2.0 ",
		"num_requests_running=7", "num_requests_running=-1", "cpu_utilization=0.3", "=", "x", "", " ", "num_requests_waiting=abc"}
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		b.WriteString("TEXT ")
		for n := rng.Intn(5); n >= 0; n-- {
			b.WriteString(parts[rng.Intn(len(parts))])
			if n > 0 || rng.Intn(4) == 0 {
				b.WriteByte(',')
			}
		}
		if got, want := ParseORCA(b.String()), split(b.String()); got != want {
			t.Fatalf("ParseORCA(%q) = %+v, want %+v", b.String(), got, want)
		}
	}
	v := "TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=2.0, named_metrics.num_requests_running=3"
	if n := testing.AllocsPerRun(100, func() { ParseORCA(v) }); n != 0 {
		t.Errorf("ParseORCA allocates %v times per TEXT report, want 0", n)
	}
}

// FuzzParseORCA: whatever an engine puts in the header, a report either
// reads in-range metrics or is the zero report, which changes nothing.
func FuzzParseORCA(f *testing.F) {
	f.Add("TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=2.0, cpu_utilization=0.3")
	f.Add(`JSON {"named_metrics":{"kv_cache_usage_perc":0.9,"num_requests_running":7}}`)
	f.Add("TEXT num_requests_running=-1,=,x")
	f.Add("TEXT num_requests_waiting=1e300")
	f.Fuzz(func(t *testing.T, v string) {
		l := ParseORCA(v)
		if !l.OK {
			if l != (LoadReport{}) {
				t.Fatalf("ParseORCA(%q) = %+v: not OK, yet not the zero report", v, l)
			}
			return
		}
		if l.KVUsage < 0 || l.KVUsage > 1 || l.Waiting < 0 || l.Running < 0 {
			t.Fatalf("ParseORCA(%q) = %+v: out of range", v, l)
		}
	})
}
