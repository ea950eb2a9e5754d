package filter

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/index"
)

// GetAppend answers as Get does, never hands out the emulator's own storage
// (the index edits what it reads in place), and leaves dst alone on a miss.
func TestSharedStoreGetAppendMatchesGet(t *testing.T) {
	newHost(t, RootRouter, threeEndpoints+"}", types.OnPluginStartStatusOK)
	st := sharedStore{emulated: true}
	if err := st.Set("k", []byte("value-1"), 0); err != nil {
		t.Fatal(err)
	}
	want, wantCAS, err := st.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	for _, dst := range [][]byte{nil, make([]byte, 0, 2), make([]byte, 0, 64)} {
		got, cas, err := st.GetAppend(dst, "k")
		if err != nil || cas != wantCAS || !bytes.Equal(got, want) {
			t.Fatalf("GetAppend(cap %d) = %q, %d, %v; Get gave %q, %d", cap(dst), got, cas, err, want, wantCAS)
		}
		if cap(dst) >= len(want) && &got[0] != &dst[:1][0] {
			t.Errorf("GetAppend(cap %d) did not reuse dst", cap(dst))
		}
		got[0] = 'X' // the caller edits its copy
		if again, _, _ := st.Get("k"); !bytes.Equal(again, want) {
			t.Fatalf("editing GetAppend's result changed the stored value to %q", again)
		}
	}
	// It appends: what dst holds stays in front.
	prefix := append(make([]byte, 0, 64), "kept:"...)
	if got, _, err := st.GetAppend(prefix, "k"); err != nil || string(got) != "kept:"+string(want) {
		t.Fatalf("GetAppend(%q, k) = %q, %v; want %q", prefix, got, err, "kept:"+string(want))
	}
	dst := append(make([]byte, 0, 8), "keep"...)
	got, _, err := st.GetAppend(dst[:0], "missing")
	if !errors.Is(err, index.ErrNotFound) || len(got) != 0 || string(dst) != "keep" {
		t.Fatalf("GetAppend(missing) = %q, %v (dst now %q); want empty, ErrNotFound, dst untouched", got, err, dst)
	}
}
