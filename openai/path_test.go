package openai

import "testing"

func TestSamePathReadsPathsAsServersDo(t *testing.T) {
	const want = "/.kvroute/v1/state"
	for _, p := range []string{want, want + "/", "/.kvroute//v1/state", "//.kvroute/v1/state//", "/.KVROUTE/V1/STATE",
		"/.kvroute/v1/stat%65", "/.kvroute%2Fv1%2fstate", "/%2ekvroute/v1/state"} {
		if !SamePath(p, want) {
			t.Errorf("SamePath(%q) = false", p)
		}
	}
	for _, p := range []string{"/.kvroute/v1/stat", "/.kvroute/v1/states", "/.kvroute/v1/state/x", "/kvroute/v1/state", "", "/", "/.kvroute/v1/stat%6", "/.kvroute/v1/stat%zz"} {
		if SamePath(p, want) {
			t.Errorf("SamePath(%q) = true", p)
		}
	}
}

// ModelID reads GET /v1/models/{id} as SamePath reads the prefix, and the
// id percent-decoded with its case and slashes kept.
func TestModelIDReadsThePathAsServersDo(t *testing.T) {
	for path, want := range map[string]string{
		"/v1/models/m":                       "m",
		"/v1/models/meta-llama/Llama-3.1-8B": "meta-llama/Llama-3.1-8B",
		"//V1/Models//Qwen%2FQwen3":          "Qwen/Qwen3",
		"/v1%2fmodels/a%20b":                 "a b",
		"/v1/models/%zz":                     "%zz",
	} {
		if got, ok := ModelID(path); !ok || got != want {
			t.Errorf("ModelID(%q) = %q, %v; want %q", path, got, ok, want)
		}
	}
	for _, path := range []string{"/v1/models", "/v1/models/", "/v1/models//", "/v1/modelsx/m", "/v2/models/m", ""} {
		if got, ok := ModelID(path); ok {
			t.Errorf("ModelID(%q) = %q, want no id", path, got)
		}
	}
}
