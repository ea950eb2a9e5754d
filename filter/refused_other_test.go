//go:build !unix

package filter_test

import (
	"net"
	"testing"
)

// refusedAddr returns a local address that refuses connections: the port
// of a listener just closed (another process may take it meanwhile; the
// unix build holds it for the whole test).
func refusedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
