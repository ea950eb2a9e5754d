//go:build unix

package filter_test

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// refusedAddr returns a local address that refuses connections for the
// whole test: a socket bound to it but never listening holds the port, so
// no other process on the machine can take it (as it could a port freed
// by closing a listener) and every connection to it is refused.
func refusedAddr(t *testing.T) string {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}
