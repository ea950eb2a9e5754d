package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestProgressBarDrawsThrottlesAndClears(t *testing.T) {
	var out bytes.Buffer
	progress := drawProgress(&out, 200)

	progress(100)
	half := regexp.MustCompile(`^\r\[#{20}\.{20}\]  50%\s+\d+\.\ds$`)
	if !half.MatchString(out.String()) {
		t.Fatalf("half way: drew %q", out.String())
	}
	out.Reset()
	progress(150) // within 100 ms of the last draw: skipped
	if out.Len() != 0 {
		t.Errorf("redrew within 100 ms: %q", out.String())
	}
	progress(200) // 100% is always drawn
	if full := regexp.MustCompile(`^\r\[#{40}\] 100%\s+\d+\.\ds$`); !full.MatchString(out.String()) {
		t.Errorf("at 100%%: drew %q", out.String())
	}
	out.Reset()
	progress(-1)
	if s := out.String(); !strings.HasPrefix(s, "\r") || !strings.HasSuffix(s, "\r") || strings.Trim(s, "\r ") != "" {
		t.Errorf("finishing did not blank the line: %q", s)
	}
}

// TestProgressBarOnlyOnTerminals: files, /dev/null (a character device,
// yet no terminal) and plain writers get no bar.
func TestProgressBarOnlyOnTerminals(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	for name, w := range map[string]io.Writer{"a file": f, os.DevNull: null, "a buffer": &bytes.Buffer{}} {
		if progressBar(w, 10) != nil {
			t.Errorf("%s got a progress bar", name)
		}
	}
}
