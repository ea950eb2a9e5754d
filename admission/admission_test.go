package admission

import (
	"fmt"
	"strings"
	"testing"
)

func TestParseClass(t *testing.T) {
	for in, want := range map[string]Class{"interactive": Interactive, "Batch": Batch, " standard ": Standard, "0": 0, "7": 7, "9": 9} {
		got, err := ParseClass(in)
		if err != nil || got != want {
			t.Errorf("ParseClass(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "urgent", "10", "-1", "1.5"} {
		if _, err := ParseClass(bad); err == nil || !strings.Contains(err.Error(), "interactive, standard, batch") {
			t.Errorf("ParseClass(%q): error %v, want one naming the choices", bad, err)
		}
	}
	if Class(7).Band() != 1 || Class(9).Band() != 2 || Class(4).Band() != 0 {
		t.Error("bands: 7 is standard, 9 interactive, 4 batch")
	}
}

func TestClassifyAndDeadline(t *testing.T) {
	c := Defaults()
	c.PathClasses = map[string]Class{"/v1/embeddings": Batch}
	c.ModelClasses = map[string]Class{"chat-model": Interactive}
	cases := []struct {
		header, path, model string
		want                Class
	}{
		{"", "/v1/completions", "other", Standard},
		{"", "/v1/embeddings", "other", Batch},
		{"", "/v1/embeddings", "chat-model", Interactive}, // model over path
		{"batch", "/v1/completions", "chat-model", Batch}, // header over both
		{"3", "/v1/completions", "", 3},
	}
	for _, tc := range cases {
		got, err := c.Classify(tc.header, tc.path, tc.model)
		if err != nil || got != tc.want {
			t.Errorf("Classify(%q, %q, %q) = %v, %v; want %v", tc.header, tc.path, tc.model, got, err, tc.want)
		}
	}
	if _, err := c.Classify("soon", "", ""); err == nil {
		t.Error("a malformed header must be an error")
	}
	if d, _ := c.Deadline(Interactive, "", 1000); d != 1000+DefaultInteractiveD {
		t.Errorf("interactive default deadline %d", d)
	}
	if d, _ := c.Deadline(Batch, "250", 1000); d != 1250 {
		t.Errorf("header deadline %d, want 1250", d)
	}
	for _, bad := range []string{"0", "-5", "x", "3600001"} {
		if _, err := c.Deadline(Batch, bad, 0); err == nil {
			t.Errorf("deadline %q accepted", bad)
		}
	}
}

func TestValidate(t *testing.T) {
	c := Defaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Thresholds = Thresholds{}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "thresholds") {
		t.Errorf("no threshold: %v", err)
	}
	c = Defaults()
	c.DeadlineMs[2] = 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "deadlineMs.interactive") {
		t.Errorf("zero deadline: %v", err)
	}
}

func TestSaturation(t *testing.T) {
	th := Thresholds{MaxWaiting: 4, MaxKVUsage: 0.9, MaxPendingPrefillTokens: 1000}
	free := Load{Waiting: 3, KVUsage: 0.5, PendingPrefillTokens: 999}
	for _, l := range []Load{{Waiting: 4}, {KVUsage: 0.9}, {PendingPrefillTokens: 1000}} {
		if !th.Saturated(l) {
			t.Errorf("%+v not saturated", l)
		}
	}
	if th.Saturated(free) {
		t.Errorf("%+v saturated", free)
	}
	if th.AllSaturated([]Load{{Waiting: 9}, free}) || !th.AllSaturated([]Load{{Waiting: 9}, {KVUsage: 1}}) {
		t.Error("AllSaturated needs every host saturated")
	}
	if th.AllSaturated(nil) {
		t.Error("no eligible host must not hold (the router answers)")
	}
	off := Thresholds{MaxPendingPrefillTokens: 10}
	if off.Saturated(Load{Waiting: 1000, KVUsage: 1}) {
		t.Error("zero thresholds are off")
	}
}

func TestQueueOrderClassThenDeadlineThenArrival(t *testing.T) {
	q := NewQueue(10)
	push := func(id uint64, c Class, dl int64) {
		if _, ev, ok := q.Push(Item{ID: id, Class: c, DeadlineMs: dl}); !ok || ev {
			t.Fatalf("push %d: ok %v evicted %v", id, ok, ev)
		}
	}
	push(1, Batch, 100)
	push(2, Interactive, 900)
	push(3, Standard, 50)
	push(4, Interactive, 500)
	push(5, Interactive, 500) // same deadline as 4: arrival order
	push(6, Batch, 10)
	var got []uint64
	for q.Len() > 0 {
		it, _ := q.Pop()
		got = append(got, it.ID)
	}
	want := []uint64{4, 5, 2, 3, 6, 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("release order %v, want %v", got, want)
	}
}

func TestQueueShedsLowestFirstAndOverflows(t *testing.T) {
	q := NewQueue(2)
	q.Push(Item{ID: 1, Class: Batch, DeadlineMs: 100})
	q.Push(Item{ID: 2, Class: Batch, DeadlineMs: 50})
	// Full: an equal-ranked newcomer (batch, later deadline) overflows.
	if _, _, ok := q.Push(Item{ID: 3, Class: Batch, DeadlineMs: 200}); ok {
		t.Fatal("a batch request ranking below every held one must overflow")
	}
	// An interactive newcomer sheds the worst batch request (latest deadline).
	shed, ev, ok := q.Push(Item{ID: 4, Class: Interactive, DeadlineMs: 1000})
	if !ok || !ev || shed.ID != 1 {
		t.Fatalf("shed %+v evicted %v ok %v, want request 1 shed", shed, ev, ok)
	}
	if q.Holds(1) || !q.Holds(4) || q.Len() != 2 {
		t.Fatal("queue contents after shedding")
	}
	if b := q.ByBand(); b != [3]int{1, 0, 1} {
		t.Fatalf("by band %v", b)
	}
	if _, ok := q.Remove(2); !ok || q.Holds(2) || q.Len() != 1 {
		t.Fatal("remove")
	}
	if _, ok := q.Remove(2); ok {
		t.Fatal("removed twice")
	}
}

func TestControllerArriveTickCancel(t *testing.T) {
	c := Defaults()
	c.MaxHeld = 3
	ctl := NewController(c)
	if v, _, _ := ctl.Arrive(1, Standard, 1000, 0, false); v != Admit {
		t.Fatalf("free engine: %v", v)
	}
	if v, _, _ := ctl.Arrive(2, Batch, 500, 0, true); v != Hold {
		t.Fatalf("saturated: %v", v)
	}
	// Capacity back, but a batch request is held: a newcomer of a higher
	// class goes at once, one of the same class waits its turn.
	if v, _, _ := ctl.Arrive(3, Interactive, 500, 1, false); v != Admit {
		t.Fatalf("interactive over held batch: %v", v)
	}
	if v, _, _ := ctl.Arrive(4, Batch, 600, 1, false); v != Hold {
		t.Fatalf("batch behind held batch: %v", v)
	}
	ctl.Arrive(5, Interactive, 50, 2, true)
	ctl.Arrive(6, Standard, 5000, 2, true) // full: sheds request 4 (batch, latest deadline)
	if v, _, _ := ctl.Arrive(7, Batch, 9999, 2, true); v != Refuse {
		t.Fatalf("overflow: %v", v)
	}
	if !ctl.Cancel(2) || ctl.Cancel(2) {
		t.Fatal("cancel")
	}
	ctl.Arrive(8, Batch, 10, 3, true)
	// Tick at 60: request 5 (deadline 50) and 8 (10) expire; one slot frees.
	room := 1
	var released []uint64
	expired := ctl.Tick(60, func() bool { return room == 0 }, func(it Item) { released = append(released, it.ID); room-- })
	if len(expired) != 2 || len(released) != 1 || released[0] != 6 {
		t.Fatalf("expired %+v released %v", expired, released)
	}
	s := ctl.Stats()
	want := Stats{Admitted: 2, Held: 5, Released: 1, Expired: 2, Shed: 1, Overflow: 1, Cancelled: 1}
	if s != want {
		t.Fatalf("stats %+v, want %+v", s, want)
	}
	zero := Defaults()
	zero.MaxHeld = 0
	if v, _, _ := NewController(zero).Arrive(1, Interactive, 1, 0, true); v != Refuse {
		t.Fatal("maxHeld 0 refuses instead of holding")
	}
}
