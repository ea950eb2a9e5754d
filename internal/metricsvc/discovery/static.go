package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"sigs.k8s.io/yaml"
)

// File is the static list: a YAML file such as
//
//	endpoints:
//	  - address: 10.0.0.7:8000
//	    role: decode
//	    model: llama-3-8b
//	    adapters: [sql-lora]
//	    kvEvents: tcp://10.0.0.7:5557
//
// It is re-read when its modification time or size changes (checked every
// Poll), so editing a mounted ConfigMap takes effect without a restart; a
// file that no longer parses is reported and the previous list kept.
// Replace the file atomically (write a temporary file, then rename, as
// Kubernetes does for ConfigMap volumes): a rewrite in place can be read
// half-written.
type File struct {
	Path string
	Poll time.Duration // default 5 s
	Log  *slog.Logger
}

type fileDoc struct {
	// A pointer, so a file without the key (an empty file caught halfway
	// through a non-atomic rewrite, say) is an error rather than an empty
	// fleet; "endpoints: []" is allowed.
	Endpoints *[]Endpoint `json:"endpoints"`
}

// Name implements Source.
func (f *File) Name() string { return "static" }

// LoadFile reads and validates an endpoint file.
func LoadFile(path string) ([]Endpoint, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("endpoints file: %w", err)
	}
	return ParseFile(b)
}

// ParseFile parses the YAML of an endpoint file. Unknown keys are errors, so
// a misspelt field is not silently ignored.
func ParseFile(b []byte) ([]Endpoint, error) {
	var doc fileDoc
	if err := yaml.UnmarshalStrict(b, &doc); err != nil {
		return nil, fmt.Errorf("endpoints file: %w", err)
	}
	if doc.Endpoints == nil {
		return nil, errors.New("endpoints file: no \"endpoints\" key (write \"endpoints: []\" for an empty fleet)")
	}
	eps := *doc.Endpoints
	seen := map[string]bool{}
	for i := range eps {
		e := &eps[i]
		if err := e.Validate(); err != nil {
			return nil, fmt.Errorf("endpoints file, entry %d: %w", i+1, err)
		}
		if seen[e.Address] {
			return nil, fmt.Errorf("endpoints file, entry %d: address %s listed twice", i+1, e.Address)
		}
		seen[e.Address] = true
	}
	return eps, nil
}

// Run implements Source. The first read must succeed; later failures keep
// the last good list.
func (f *File) Run(ctx context.Context, update func([]Endpoint)) error {
	log := f.Log
	if log == nil {
		log = slog.Default()
	}
	poll := f.Poll
	if poll <= 0 {
		poll = 5 * time.Second
	}
	eps, err := LoadFile(f.Path)
	if err != nil {
		return err
	}
	st, _ := os.Stat(f.Path)
	update(eps)
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cur, err := os.Stat(f.Path)
		if err != nil {
			log.Warn("endpoints file unreadable; keeping the previous list", "path", f.Path, "err", err)
			continue
		}
		if st != nil && cur.ModTime().Equal(st.ModTime()) && cur.Size() == st.Size() {
			continue
		}
		st = cur
		next, err := LoadFile(f.Path)
		if err != nil {
			log.Warn("endpoints file changed but is invalid; keeping the previous list", "path", f.Path, "err", err)
			continue
		}
		if !Equal(next, eps) {
			eps = next
			log.Info("endpoints file reloaded", "path", f.Path, "endpoints", len(eps))
			update(eps)
		}
	}
}

// Fixed is an endpoint list given directly (command-line flags, tests).
type Fixed []Endpoint

// Name implements Source.
func (Fixed) Name() string { return "fixed" }

// Run implements Source.
func (f Fixed) Run(ctx context.Context, update func([]Endpoint)) error {
	for i := range f {
		if err := f[i].Validate(); err != nil {
			return err
		}
	}
	update(f)
	<-ctx.Done()
	return nil
}
