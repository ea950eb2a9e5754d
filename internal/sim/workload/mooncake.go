package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// mooncakeLine is one line of a Mooncake trace (FAST'25 release format).
type mooncakeLine struct {
	Timestamp    *float64 `json:"timestamp"` // ms since the trace start
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// maxTimestampMs bounds trace timestamps so arrival times fit a Duration
// at any rate scale >= 0.01.
const maxTimestampMs = 365 * 24 * 3600 * 1000

// TraceOptions controls trace replay.
type TraceOptions struct {
	// RateScale multiplies the request rate: arrival times are divided by
	// it (2 replays the trace twice as fast). 0 means 1.
	RateScale float64
	// Model is the model name put on every request.
	Model string
	// Limit keeps only the first Limit requests (0: all).
	Limit int
	// SessionsFromPrefix gives each request a session id derived from its
	// first hash id. Mooncake traces carry no session ids, so by default
	// requests have none; this models clients that send one conversation
	// id per shared first block (generous: users sharing a system prompt
	// then share a session).
	SessionsFromPrefix bool
}

// LoadMooncake reads a Mooncake JSONL trace file.
func LoadMooncake(path string, opt TraceOptions) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	w, err := ReadMooncake(f, opt)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	w.Name = path
	return w, nil
}

// ReadMooncake parses a Mooncake JSONL trace. Every line must be a JSON
// object with a timestamp, a positive input_length whose 512-token blocks
// match hash_ids, and a non-negative output_length; the error names the
// first line that is not.
func ReadMooncake(r io.Reader, opt TraceOptions) (*Workload, error) {
	scale := opt.RateScale
	if scale == 0 {
		scale = 1
	}
	if scale < 0.01 || scale > 1e6 {
		return nil, fmt.Errorf("rate scale must be between 0.01 and 1e6, got %g", scale)
	}
	model := opt.Model
	if model == "" {
		model = "llama-3-8b"
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	w := &Workload{}
	lineNo := 0
	var prev float64
	for sc.Scan() {
		lineNo++
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var l mooncakeLine
		if err := json.Unmarshal(line, &l); err != nil {
			return nil, fmt.Errorf("line %d: not a trace record: %w", lineNo, err)
		}
		switch {
		case l.Timestamp == nil:
			return nil, fmt.Errorf("line %d: missing timestamp", lineNo)
		case *l.Timestamp < 0 || *l.Timestamp > maxTimestampMs:
			return nil, fmt.Errorf("line %d: timestamp %g ms is outside 0..%g (a trace of at most a year)", lineNo, *l.Timestamp, float64(maxTimestampMs))
		case *l.Timestamp < prev:
			return nil, fmt.Errorf("line %d: timestamp %g goes back in time (previous %g); sort the trace by timestamp", lineNo, *l.Timestamp, prev)
		case l.InputLength <= 0:
			return nil, fmt.Errorf("line %d: input_length must be positive, got %d", lineNo, l.InputLength)
		case l.OutputLength < 0:
			return nil, fmt.Errorf("line %d: output_length must not be negative, got %d", lineNo, l.OutputLength)
		case len(l.HashIDs) != (l.InputLength+MooncakeBlockTokens-1)/MooncakeBlockTokens:
			return nil, fmt.Errorf("line %d: %d hash_ids do not cover input_length %d in %d-token blocks (want %d)",
				lineNo, len(l.HashIDs), l.InputLength, MooncakeBlockTokens, (l.InputLength+MooncakeBlockTokens-1)/MooncakeBlockTokens)
		}
		prev = *l.Timestamp
		id := len(w.Requests)
		session := ""
		if opt.SessionsFromPrefix {
			session = fmt.Sprintf("trace-%d", l.HashIDs[0])
		}
		w.Requests = append(w.Requests, Request{
			ID:           id,
			Arrival:      time.Duration(*l.Timestamp / scale * float64(time.Millisecond)),
			Model:        model,
			Session:      session,
			HashIDs:      l.HashIDs,
			PromptTokens: l.InputLength,
			OutputTokens: max(1, l.OutputLength),
		})
		if opt.Limit > 0 && len(w.Requests) >= opt.Limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", lineNo+1, err)
	}
	if len(w.Requests) == 0 {
		return nil, fmt.Errorf("trace has no requests")
	}
	return w, nil
}

// CeilingBlocks is the trace's own prefix-cache ceiling counted the way the
// trace README counts it: with one infinite cache, the fraction of input
// tokens in leading 512-token blocks already seen (a partially filled last
// block counts its actual tokens).
func CeilingBlocks(w *Workload) float64 {
	seen := make(map[int64]struct{})
	var hit, total int64
	for i := range w.Requests {
		r := &w.Requests[i]
		total += int64(r.PromptTokens)
		m := 0
		for _, id := range r.HashIDs {
			if _, ok := seen[id]; !ok {
				break
			}
			m++
		}
		hit += int64(min(m*MooncakeBlockTokens, r.PromptTokens))
		for _, id := range r.HashIDs {
			seen[id] = struct{}{}
		}
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}
