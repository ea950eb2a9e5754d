package testenv

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	msg := FatalMessage(t, func(tb testing.TB) { WaitFor(tb, "three polls", func() bool { return n.Add(1) >= 3 }) })
	if msg != "" || n.Load() != 3 {
		t.Errorf("WaitFor failed with %q after %d polls, want success on the third", msg, n.Load())
	}
}

func TestWaitWithinFailsNamingWhatItWaitedFor(t *testing.T) {
	start := time.Now()
	msg := FatalMessage(t, func(tb testing.TB) {
		WaitWithin(tb, 30*time.Millisecond, "the impossible", func() bool { return false })
	})
	if !strings.Contains(msg, "the impossible") || !strings.Contains(msg, "30ms") {
		t.Errorf("WaitWithin failed with %q, want the bound and what it waited for", msg)
	}
	if time.Since(start) < 30*time.Millisecond {
		t.Errorf("WaitWithin gave up after %v, before its bound", time.Since(start))
	}
}

func TestModuleReadsKVROUTE_WASMAndSaysHowToBuildAMissingOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.wasm")
	if err := os.WriteFile(path, []byte("\x00asm"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KVROUTE_WASM", path)
	if got := string(Module(t)); got != "\x00asm" {
		t.Errorf("Module read %q, want the file KVROUTE_WASM names", got)
	}
	t.Setenv("KVROUTE_WASM", path+".absent")
	if msg := FatalMessage(t, func(tb testing.TB) { Module(tb) }); !strings.Contains(msg, "make wasm") {
		t.Errorf("a missing module failed with %q, want the command that builds it", msg)
	}
}

func TestRepoRootHoldsGoMod(t *testing.T) {
	root := RepoRoot(t)
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil || filepath.Base(root) == "testenv" {
		t.Errorf("RepoRoot = %s: %v", root, err)
	}
}

func TestCallSendsJSONWithHeadersAndReturnsTheAnswer(t *testing.T) {
	url := Serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Echo", r.Header.Get("X-Test")+"|"+r.Header.Get("Content-Type"))
		w.WriteHeader(201)
		io.WriteString(w, r.Method+" "+string(b))
	}), nil)
	code, body, hdr := Call(t, "POST", url+"/p", `{"a":1}`, map[string]string{"X-Test": "v"})
	if code != 201 || body != `POST {"a":1}` || hdr.Get("X-Echo") != "v|application/json" {
		t.Errorf("Call = %d %q %v", code, body, hdr)
	}
	resp, err := http.Get(url)
	if got := Drain(t, resp, err); got != 201 {
		t.Errorf("Drain = %d, want the status", got)
	}
	if msg := FatalMessage(t, func(tb testing.TB) { Drain(tb, nil, io.ErrUnexpectedEOF) }); !strings.Contains(msg, "unexpected EOF") {
		t.Errorf("Drain of a failed request failed with %q, want the request's error", msg)
	}
}

// A LockedBuffer with Max keeps the first Max bytes and tells its writer
// every write succeeded (a child process's stderr must never block or fail
// on it); without Max it keeps everything.
func TestLockedBufferKeepsTheFirstMaxBytes(t *testing.T) {
	capped, whole := &LockedBuffer{Max: 5}, &LockedBuffer{}
	for _, w := range []string{"abc", "defg", "hi"} {
		for _, b := range []*LockedBuffer{capped, whole} {
			if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
				t.Fatalf("Write(%q) = %d, %v", w, n, err)
			}
		}
	}
	if capped.String() != "abcde" || whole.String() != "abcdefghi" {
		t.Errorf("capped %q, whole %q; want %q and %q", capped.String(), whole.String(), "abcde", "abcdefghi")
	}
}
