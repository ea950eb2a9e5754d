package scrape

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// vllmPage builds a page shaped like a real vLLM /metrics: the handful of
// gauges the scraper reads plus the latency histograms that make up most of
// the page (vLLM exports about 20, each with 10 to 40 buckets).
func vllmPage(tb testing.TB) []byte {
	base, err := os.ReadFile("testdata/vllm.txt")
	if err != nil {
		tb.Fatal(err)
	}
	var b bytes.Buffer
	for h := range 20 {
		name := fmt.Sprintf("vllm:latency_%d_seconds", h)
		fmt.Fprintf(&b, "# HELP %s A latency histogram.\n# TYPE %s histogram\n", name, name)
		for i := range 30 {
			fmt.Fprintf(&b, "%s_bucket{engine=\"0\",le=\"%g\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} %d\n", name, 0.001*float64(int(1)<<(i%20)), i*7)
		}
		fmt.Fprintf(&b, "%s_bucket{engine=\"0\",le=\"+Inf\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 210\n", name)
		fmt.Fprintf(&b, "%s_count{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 210\n", name)
		fmt.Fprintf(&b, "%s_sum{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 12.5\n", name)
	}
	b.Write(base)
	return b.Bytes()
}

// BenchmarkParse compares the scraper (line filter, then expfmt on what is
// left) with the baseline of handing the whole page to expfmt, in the same
// run. Run with: go test -run '^$' -bench Parse -benchmem ./internal/metricsvc/scrape
func BenchmarkParse(b *testing.B) {
	page := vllmPage(b)
	b.Run("filtered", func(b *testing.B) {
		var p Parser
		b.SetBytes(int64(len(page)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.Parse(bytes.NewReader(page)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline_full_expfmt", func(b *testing.B) {
		b.SetBytes(int64(len(page)))
		b.ReportAllocs()
		for b.Loop() {
			tp := expfmt.NewTextParser(model.UTF8Validation)
			fams, err := tp.TextToMetricFamilies(bytes.NewReader(page))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := extract(fams); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkParseVsFullExpfmt alternates the two in one loop (same machine
// load for both) and reports the ratio of their times: below 1 means the
// filtered parse is faster.
func BenchmarkParseVsFullExpfmt(b *testing.B) {
	page := vllmPage(b)
	var p Parser
	var ours, base time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := p.Parse(bytes.NewReader(page)); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		tp := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := tp.TextToMetricFamilies(bytes.NewReader(page))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := extract(fams); err != nil {
			b.Fatal(err)
		}
		ours += t1.Sub(t0)
		base += time.Since(t1)
	}
	b.ReportMetric(float64(ours.Nanoseconds())/float64(b.N), "filtered-ns/op")
	b.ReportMetric(float64(base.Nanoseconds())/float64(b.N), "full-ns/op")
	b.ReportMetric(float64(ours)/float64(base), "ratio")
}

func TestBenchPageParses(t *testing.T) {
	page := vllmPage(t)
	if n := strings.Count(string(page), "\n"); n < 600 {
		t.Fatalf("page has %d lines", n)
	}
	var p Parser
	s, err := p.Parse(bytes.NewReader(page))
	if err != nil || s.Waiting != 5 {
		t.Fatalf("%+v %v", s, err)
	}
	// the baseline must see the same numbers
	tp := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := tp.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := extract(fams)
	if err != nil || s2.Waiting != s.Waiting || s2.KVUsage != s.KVUsage || s2.NumGPUBlocks != s.NumGPUBlocks {
		t.Fatalf("baseline %+v differs from %+v (%v)", s2, s, err)
	}
}

// BenchmarkScrapeOnceVsGet measures one whole scrape over loopback HTTP of
// a vLLM-shaped page (request, filter, parse, extract) against the baseline
// of only fetching the same page, alternating in one loop. The scrape's
// time per op times engines times scrapes per second is the service's CPU
// budget for scraping.
func BenchmarkScrapeOnceVsGet(b *testing.B) {
	page := vllmPage(b)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(page) }))
	defer srv.Close()
	l := &Loop{Client: srv.Client(), Address: "a", URL: srv.URL + "/metrics", Interval: time.Second, Timeout: 10 * time.Second}
	var ours, base time.Duration
	for b.Loop() {
		t0 := time.Now()
		if r := l.Once(context.Background()); r.Err != nil {
			b.Fatal(r.Err)
		}
		t1 := time.Now()
		resp, err := srv.Client().Get(srv.URL + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ours += t1.Sub(t0)
		base += time.Since(t1)
	}
	b.ReportMetric(float64(ours.Nanoseconds())/float64(b.N), "scrape-ns/op")
	b.ReportMetric(float64(base.Nanoseconds())/float64(b.N), "get-ns/op")
	b.ReportMetric(float64(ours)/float64(base), "ratio")
}
