package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// `kvroute metrics --gateway not-a-url` stops at start, saying why, instead
// of running with every push failing.
func TestMetricsRefusesABadGatewayURLAtStart(t *testing.T) {
	dir := t.TempDir()
	eps := filepath.Join(dir, "endpoints.yaml")
	os.WriteFile(eps, []byte("- address: 127.0.0.1:1\n"), 0o644)
	t.Setenv("KVROUTE_TEST_TOKEN", "tok")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	o := &metricsOptions{endpointsFile: eps, gateways: []string{"not-a-url"}, tokenEnv: "KVROUTE_TEST_TOKEN",
		listen: "127.0.0.1:0", logLevel: "info", logFormat: "text"}
	start := time.Now()
	err := runMetrics(ctx, o, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not-a-url") || !strings.Contains(err.Error(), "http") {
		t.Fatalf("runMetrics = %v, want an error naming the URL and the scheme", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("the error came after %v: at start, please", time.Since(start))
	}
}
