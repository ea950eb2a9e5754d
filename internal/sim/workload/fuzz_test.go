package workload

import (
	"strings"
	"testing"
)

// A trace file is user input: any bytes give a workload or an error naming
// a line, never a panic, and an accepted workload is consistent.
func FuzzReadMooncake(f *testing.F) {
	f.Add(`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`)
	f.Add(`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}` + "\n" + `{"timestamp": 3, "input_length": 10, "output_length": 0, "hash_ids": [1]}`)
	f.Add(`{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [9]}`)
	f.Add(`{"timestamp": 1e308, "input_length": 512, "output_length": 1e3, "hash_ids": [-5]}`)
	f.Add("{\n\x00")
	f.Add(`{"timestamp": 1e13, "input_length": 1, "output_length": 1, "hash_ids": [1]}`)
	f.Fuzz(func(t *testing.T, in string) {
		w, err := ReadMooncake(strings.NewReader(in), TraceOptions{RateScale: 3})
		if err != nil {
			if !strings.Contains(err.Error(), "line") && !strings.Contains(err.Error(), "no requests") {
				t.Fatalf("error without a line number: %v", err)
			}
			return
		}
		for i, r := range w.Requests {
			if r.Arrival < 0 {
				t.Fatalf("request %d arrives at %v", i, r.Arrival)
			}
			if r.PromptTokens < 1 || r.OutputTokens < 1 || (i > 0 && r.Arrival < w.Requests[i-1].Arrival) {
				t.Fatalf("inconsistent request %d: %+v", i, r)
			}
			if r.PromptTokens <= 1<<16 && len(r.Text()) != 4*r.PromptTokens {
				t.Fatalf("request %d: %d bytes of text for %d tokens", i, len(r.Text()), r.PromptTokens)
			}
		}
	})
}
