package filter

import "testing"

func TestSamePathReadsPathsAsServersDo(t *testing.T) {
	const want = "/.kvroute/v1/state"
	for _, p := range []string{want, want + "/", "/.kvroute//v1/state", "//.kvroute/v1/state//", "/.KVROUTE/V1/STATE",
		"/.kvroute/v1/stat%65", "/.kvroute%2Fv1%2fstate", "/%2ekvroute/v1/state"} {
		if !samePath(p, want) {
			t.Errorf("samePath(%q) = false", p)
		}
	}
	for _, p := range []string{"/.kvroute/v1/stat", "/.kvroute/v1/states", "/.kvroute/v1/state/x", "/kvroute/v1/state", "", "/", "/.kvroute/v1/stat%6", "/.kvroute/v1/stat%zz"} {
		if samePath(p, want) {
			t.Errorf("samePath(%q) = true", p)
		}
	}
}
