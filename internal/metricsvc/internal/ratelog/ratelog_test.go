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
	// The limiter's clock moves only when the test moves it: the five
	// repeats are within the period however slow the machine.
	now := time.Unix(1_800_000_000, 0)
	l := Limiter{Period: 50 * time.Millisecond, now: func() time.Time { return now }}
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
	now = now.Add(49 * time.Millisecond)
	l.Log(log, slog.LevelWarn, "a", "bad input")
	if n := strings.Count(buf.String(), "bad input"); n != 1 {
		t.Fatalf("%d lines for a repeat 49 ms into a 50 ms period:\n%s", n, buf.String())
	}
	now = now.Add(time.Millisecond)
	l.Log(log, slog.LevelWarn, "a", "bad input")
	if !strings.Contains(buf.String(), "suppressed=5") {
		t.Errorf("the next line does not say how many were suppressed:\n%s", buf.String())
	}
}
