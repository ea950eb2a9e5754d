package hostbuf

import "testing"

// A lent buffer serves exactly one allocation that fits, then is gone; one
// too small, or none, leaves the allocator to make its own.
func TestTakeServesOneFittingAllocation(t *testing.T) {
	t.Cleanup(func() { Lend(nil) })
	buf := make([]byte, 8, 64)
	Lend(buf)
	if b := Take(100); b != nil {
		t.Fatalf("Take(100) from a 64-byte buffer = %d bytes, want nil", len(b))
	}
	b := Take(40)
	if len(b) != 40 || cap(b) != 40 || &b[0] != &buf[:1][0] {
		t.Fatalf("Take(40) = len %d cap %d, want the lent buffer cut to 40", len(b), cap(b))
	}
	if b := Take(10); b != nil {
		t.Fatal("a lent buffer served a second allocation")
	}
	Lend(buf)
	if b := Take(0); b != nil {
		t.Fatal("Take(0) took the buffer")
	}
	Lend(nil)
	if b := Take(10); b != nil {
		t.Fatal("Take after Lend(nil) returned a buffer")
	}
}
