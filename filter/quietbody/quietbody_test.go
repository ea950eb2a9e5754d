package quietbody

import "testing"

func TestMarks(t *testing.T) {
	if Marked(0) {
		t.Error("id 0 is marked before anything was")
	}
	Mark(7)
	if !Marked(7) || Marked(8) || Marked(7+slots) {
		t.Error("Mark(7) marked the wrong ids")
	}
	// A later stream in the same slot takes it over; the earlier one loses
	// its mark (its chunks reach the filter again).
	Mark(7 + slots)
	if Marked(7) || !Marked(7+slots) {
		t.Error("the slot's later stream did not take it over")
	}
}
