package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY returns the two ends of a new pseudo-terminal.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		t.Skipf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		m.Close()
		t.Skipf("pty number: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Skipf("open pty slave: %v", err)
	}
	return m, s
}

// TestBenchDrawsProgressOnATerminal runs bench with stderr on a
// pseudo-terminal and reads what the terminal shows.
func TestBenchDrawsProgressOnATerminal(t *testing.T) {
	master, slave := openPTY(t)
	defer master.Close()
	if progressBar(slave, 10) == nil {
		t.Fatal("a pseudo-terminal is not taken for a terminal")
	}
	shown := make(chan []byte)
	go func() {
		var b bytes.Buffer
		io.Copy(&b, master) // ends with EIO once the slave is closed
		shown <- b.Bytes()
	}()

	var stdout bytes.Buffer
	err := runBench(benchOptions{workload: "shared-prefix", replicas: 2, strategies: "round_robin",
		out: filepath.Join(t.TempDir(), "p.json"), rateScale: 1, seed: 1, limit: 200}, &stdout, slave)
	slave.Close()
	if err != nil {
		t.Fatal(err)
	}
	screen := string(<-shown)
	if !strings.Contains(screen, "\r["+strings.Repeat("#", 40)+"] 100%") {
		t.Errorf("the terminal never showed a full bar: %q", screen)
	}
	// The last thing written blanks the line.
	if last := screen[strings.LastIndex(strings.TrimSuffix(screen, "\r"), "\r"):]; strings.Trim(last, "\r ") != "" {
		t.Errorf("the bar was not cleared at the end; last line %q", last)
	}
	if strings.Contains(stdout.String(), "\r") {
		t.Errorf("control characters reached stdout: %q", stdout.String())
	}
}
