package index

import (
	"testing"
)

type fakeClock struct{ ms int64 }

func (c *fakeClock) now() int64 { return c.ms }

func newTestIndex(t testing.TB, st Store, clk *fakeClock, cfg Config) *Index {
	t.Helper()
	if cfg.Shards == 0 {
		cfg.Shards = 256
	}
	cfg.Now = clk.now
	ix, err := New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

func chain(seed uint64, n int) []uint64 {
	b := make([]uint64, n)
	h := seed
	for i := range b {
		h = h*0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019
		h ^= h >> 29
		b[i] = h
	}
	return b
}

func TestQueryRecordBasic(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1_000_000}
	ix := newTestIndex(t, st, clk, Config{})
	a, err := ix.Register("10.0.0.1:8000")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ix.Register("10.0.0.2:8000")
	c := chain(1, 40)
	var m Matches
	if err := ix.Query(c, &m); err != nil {
		t.Fatal(err)
	}
	if m.Blocks[a.Slot] != 0 || m.Blocks[b.Slot] != 0 {
		t.Fatalf("empty index matched: %v", m.Blocks)
	}
	if err := ix.Record(a, c[:25], nil); err != nil {
		t.Fatal(err)
	}
	if err := ix.Record(b, c[:7], nil); err != nil {
		t.Fatal(err)
	}
	ix.Query(c, &m)
	if m.Blocks[a.Slot] != 25 || m.Blocks[b.Slot] != 7 {
		t.Fatalf("got %v, want a=25 b=7", m.Blocks)
	}
	if s, n := m.Best(); s != a.Slot || n != 25 {
		t.Fatalf("Best = %d,%d", s, n)
	}
}
