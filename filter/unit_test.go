package filter

import (
	"testing"
)

func TestBearer(t *testing.T) {
	for header, want := range map[string]bool{
		"Bearer tok": true, "bearer tok": true, "  Bearer   tok ": true,
		"Bearer tok2": false, "Bearer": false, "Bearer ": false, "Basic tok": false, "tok": false, "": false,
	} {
		if got := authorized(header, "tok"); got != want {
			t.Errorf("authorized(%q) = %v, want %v", header, got, want)
		}
	}
	if authorized("Bearer ", "") || authorized("Bearer x", "") {
		t.Error("an empty configured token must authorize nothing")
	}
}
