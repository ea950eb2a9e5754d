package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// eachCommand calls fn for every command of the tree under c.
func eachCommand(c *cobra.Command, fn func(*cobra.Command)) {
	fn(c)
	for _, sub := range c.Commands() {
		eachCommand(sub, fn)
	}
}

// TestFlagHelpHasNoBackticks: pflag takes the first backticked word of a
// usage string as the flag's type name, so "(written by `make wasm`)" would
// print as "--wasm make wasm" in the help.
func TestFlagHelpHasNoBackticks(t *testing.T) {
	eachCommand(rootCmd, func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if strings.Contains(f.Usage, "`") {
				t.Errorf("%s --%s: usage %q has a backtick; pflag would print %q as the type",
					c.CommandPath(), f.Name, f.Usage, strings.Split(f.Usage, "`")[1])
			}
		})
	})
}

// mentionedFile matches what help texts use to point at a document or a
// file of the repository.
var mentionedFile = regexp.MustCompile(`[\w./-]+\.(?:md|yaml|json|jsonl)\b`)

// TestHelpNamesOnlyFilesInTheRepository: every help text (short, long,
// flag usage) that names a document or a repository file names one that
// exists, and none points outside the repository.
func TestHelpNamesOnlyFilesInTheRepository(t *testing.T) {
	eachCommand(rootCmd, func(c *cobra.Command) {
		texts := []string{c.Short, c.Long, c.Use, c.Example}
		c.Flags().VisitAll(func(f *pflag.Flag) { texts = append(texts, f.Usage, f.DefValue) })
		for _, text := range texts {
			if strings.Contains(text, "../") {
				t.Errorf("%s: help points outside the repository: %q", c.CommandPath(), text)
			}
			for _, name := range mentionedFile.FindAllString(text, -1) {
				if !strings.Contains(name, "/") && !strings.HasSuffix(name, ".md") {
					continue // a placeholder such as FILE.json or bench.json
				}
				if strings.HasPrefix(name, "dist/") || strings.HasPrefix(name, "/") {
					continue // build outputs and paths on the user's machine
				}
				if _, err := os.Stat(filepath.Join("..", "..", name)); err != nil {
					t.Errorf("%s: help names %s, which is not in the repository", c.CommandPath(), name)
				}
			}
		}
	})
}

// TestUnknownSubcommandSuggestsTheNearest covers the root and a command
// that only groups subcommands (which cobra would answer with its help and
// exit status 0).
func TestUnknownSubcommandSuggestsTheNearest(t *testing.T) {
	for args, want := range map[string]string{
		"bnch":      "bench",
		"metric":    "metrics",
		"oci biuld": "build",
		"oci psuh":  "push",
	} {
		var out bytes.Buffer
		rootCmd.SetArgs(strings.Fields(args))
		rootCmd.SetOut(&out)
		rootCmd.SetErr(&out)
		err := rootCmd.Execute()
		rootCmd.SetArgs(nil)
		rootCmd.SetOut(nil)
		rootCmd.SetErr(nil)
		if err == nil {
			t.Errorf("kvroute %s: no error (output %q)", args, out.String())
			continue
		}
		if !strings.Contains(err.Error(), "unknown command") || !strings.Contains(err.Error(), want) {
			t.Errorf("kvroute %s: error %q does not suggest %q", args, err, want)
		}
	}
}

// TestJSONLogDurationsAreReadable: slog's JSON handler writes a
// time.Duration as integer nanoseconds ("scrape_interval":100000000);
// the service's logs carry Go duration strings instead.
func TestJSONLogDurationsAreReadable(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLogger(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("x", "scrape_interval", 100*time.Millisecond, slog.Group("push", "retry_in", 2*time.Second), "n", 3)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatal(err)
	}
	if rec["scrape_interval"] != "100ms" {
		t.Errorf("scrape_interval = %v, want \"100ms\"", rec["scrape_interval"])
	}
	if g, _ := rec["push"].(map[string]any); g["retry_in"] != "2s" {
		t.Errorf("push.retry_in = %v, want \"2s\"", rec["push"])
	}
	if rec["n"] != 3.0 {
		t.Errorf("a number changed: n = %v", rec["n"])
	}
}

// TestBenchCreatesTheOutputFolder: the folder of --out is made before the
// simulation, not found missing when the results are written.
func TestBenchCreatesTheOutputFolder(t *testing.T) {
	out := filepath.Join(t.TempDir(), "new", "folder", "res.json")
	err := runBench(benchOptions{workload: "shared-prefix", replicas: 2, strategies: "round_robin",
		out: out, rateScale: 1, seed: 1, limit: 50}, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{out, strings.TrimSuffix(out, ".json") + ".png"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("bench did not write %s: %v", f, err)
		}
	}
	// A folder that cannot be created fails before any simulation.
	blocker := filepath.Join(t.TempDir(), "file")
	os.WriteFile(blocker, nil, 0o644)
	err = runBench(benchOptions{workload: "shared-prefix", replicas: 2, strategies: "round_robin",
		out: filepath.Join(blocker, "res.json"), rateScale: 1, seed: 1, limit: 50}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--out") {
		t.Errorf("out under a file: %v, want an --out error", err)
	}
}
