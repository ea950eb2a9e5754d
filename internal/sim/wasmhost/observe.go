package wasmhost

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// MetricType tells a counter, a gauge and a histogram apart.
type MetricType int

// Metric types, numbered as in the ABI.
const (
	Counter   MetricType = metricCounter
	Gauge     MetricType = metricGauge
	Histogram MetricType = metricHistogram
)

func (t MetricType) String() string {
	switch t {
	case Counter:
		return "counter"
	case Gauge:
		return "gauge"
	case Histogram:
		return "histogram"
	}
	return "unknown"
}

// Metric is a snapshot of one metric defined by the module. As in Envoy, a
// name defined on several workers is one stat: every VM adds to the same value.
type Metric struct {
	Name    string
	Type    MetricType
	Value   int64    // counter or gauge value; histograms: number of samples
	Samples []uint64 // histogram samples in recording order (nil otherwise)
}

type metricStore struct {
	mu sync.Mutex
	m  map[string]*Metric
}

func newMetricStore() *metricStore { return &metricStore{m: map[string]*Metric{}} }

// define returns the stat for name, creating it. Defining an existing name
// with another type makes a separate stat keyed by type, as Envoy's scopes do.
func (s *metricStore) define(name string, t MetricType) *Metric {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := name
	if m, ok := s.m[key]; ok {
		if m.Type == t {
			return m
		}
		key = name + "\x00" + t.String()
		if m, ok := s.m[key]; ok {
			return m
		}
	}
	m := &Metric{Name: name, Type: t}
	s.m[key] = m
	return m
}

func (s *metricStore) snapshot() []Metric {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Metric, 0, len(s.m))
	for _, m := range s.m {
		c := *m
		c.Samples = append([]uint64(nil), m.Samples...)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (s *metricStore) lookup(name string) (Metric, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.m[name]
	if !ok {
		return Metric{}, false
	}
	c := *m
	c.Samples = append([]uint64(nil), m.Samples...)
	return c, true
}

// LogEntry is one line the module logged, through proxy_log or by writing
// to stdout (info) or stderr (error), or one line the host logged about the
// module (a trap, a failed plugin start). Worker is -1 for host lines that
// concern no single VM.
type LogEntry struct {
	Time    time.Time
	Level   int    // LevelTrace .. LevelCritical
	Worker  int    // VM index
	RootID  string // root id of the plugin whose context logged, if known
	Message string
}

// LevelName is the Envoy name of e.Level ("info", "error", ...).
func (e LogEntry) LevelName() string {
	if e.Level >= 0 && e.Level < len(levelNames) {
		return levelNames[e.Level]
	}
	return "unknown"
}

func (e LogEntry) String() string {
	return "[" + e.LevelName() + "] wasm log " + e.RootID + ": " + e.Message
}

const maxLogEntries = 20000

type logStore struct {
	mu      sync.Mutex
	entries []LogEntry
	dropped int
	logger  *slog.Logger
}

func (s *logStore) add(e LogEntry) {
	e.Time = time.Now()
	s.mu.Lock()
	if len(s.entries) >= maxLogEntries {
		n := copy(s.entries, s.entries[maxLogEntries/2:])
		s.entries = s.entries[:n]
		s.dropped += maxLogEntries / 2
	}
	s.entries = append(s.entries, e)
	logger := s.logger
	s.mu.Unlock()
	if logger != nil {
		lv := slog.LevelInfo
		switch {
		case e.Level <= LevelDebug:
			lv = slog.LevelDebug
		case e.Level == LevelWarn:
			lv = slog.LevelWarn
		case e.Level >= LevelError:
			lv = slog.LevelError
		}
		logger.Log(context.Background(), lv, e.Message, "worker", e.Worker, "root_id", e.RootID, "wasm_level", e.LevelName())
	}
}

func (s *logStore) snapshot() []LogEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]LogEntry(nil), s.entries...)
}

func (s *logStore) matching(substr string) []LogEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []LogEntry
	for _, e := range s.entries {
		if strings.Contains(e.Message, substr) {
			out = append(out, e)
		}
	}
	return out
}

// callStats counts calls per name; entries are created once and then
// updated with atomics.
type callStats struct{ m sync.Map } // name -> *callStat

type callStat struct {
	kind  string
	count atomic.Int64
	nanos atomic.Int64
	cpu   atomic.Int64 // nanoseconds; callbacks only
}

func (s *callStats) get(name, kind string) *callStat {
	if v, ok := s.m.Load(name); ok {
		return v.(*callStat)
	}
	v, _ := s.m.LoadOrStore(name, &callStat{kind: kind})
	return v.(*callStat)
}

func (c *callStat) add(d time.Duration) {
	c.count.Add(1)
	c.nanos.Add(int64(d))
}

// addCPU is add for a callback, with the CPU time its thread used.
func (c *callStat) addCPU(d, cpu time.Duration) {
	c.add(d)
	c.cpu.Add(int64(cpu))
}

func (s *callStats) snapshot() []CallStat {
	var out []CallStat
	s.m.Range(func(k, v any) bool {
		c := v.(*callStat)
		if n := c.count.Load(); n > 0 {
			out = append(out, CallStat{Name: k.(string), Kind: c.kind, Count: n, Total: time.Duration(c.nanos.Load()), CPU: time.Duration(c.cpu.Load())})
		}
		return true
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind == "callback"
		}
		return out[i].Name < out[j].Name
	})
	return out
}
