package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	l := Limiter{Period: 50 * time.Millisecond}
	for range 5 {
		l.Log(log, slog.LevelWarn, "a", "bad input")
	}
	l.Log(log, slog.LevelWarn, "b", "other kind")
	if n := strings.Count(buf.String(), "bad input"); n != 1 {
		t.Fatalf("%d lines for 5 repeats within the period:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "other kind") {
		t.Error("another key was suppressed")
	}
	time.Sleep(60 * time.Millisecond)
	l.Log(log, slog.LevelWarn, "a", "bad input")
	if !strings.Contains(buf.String(), "suppressed=4") {
		t.Errorf("the next line does not say how many were suppressed:\n%s", buf.String())
	}
}
