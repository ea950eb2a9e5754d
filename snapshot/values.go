package snapshot

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// The syntax of the contract's values, shared with the plugin
// configuration (config reads its endpoints with it) and the request
// parser (WholeNumber). Nothing here keeps state.

// MaxDataParallelSize bounds an endpoint's ranks (Host.DataParallelSize,
// and an endpoint's in the plugin configuration): every rank takes a slot
// of the index's host table.
const MaxDataParallelSize = 64

// CheckAddress reports whether s is host:port with a numeric port, which is
// what Envoy's override_host policy compares against the cluster's
// endpoints, as the endpoints list and the state endpoint accept it; the
// error says what is wrong. IPv6 hosts are bracketed ("[fd00::1]:8000").
// (net.SplitHostPort would do, but package net pulls file-system WASI
// imports and a megabyte into the Wasm module.)
func CheckAddress(s string) error {
	host, port, problem := splitHostPort(s)
	if problem != "" {
		return fmt.Errorf("%q is not host:port (%s)", s, problem)
	}
	if host == "" {
		return fmt.Errorf("%q has no host", s)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port must be a number from 1 to 65535", s)
	}
	return nil
}

func splitHostPort(s string) (host, port, problem string) {
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", "", "missing ']'"
		}
		if !strings.HasPrefix(s[end+1:], ":") {
			return "", "", "missing port"
		}
		host, port = s[1:end], s[end+2:]
		if !strings.Contains(host, ":") {
			return "", "", "brackets are for IPv6 addresses"
		}
		return host, port, ""
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", "", "missing port"
	}
	host, port = s[:i], s[i+1:]
	if strings.Contains(host, ":") {
		return "", "", "IPv6 addresses need brackets: [addr]:port"
	}
	if strings.ContainsAny(host, " /?#@") {
		return "", "", "the host has characters a host name cannot have"
	}
	return host, port, ""
}

// WholeNumber reads a JSON integer (1e3 and 2.0 are accepted as whole). The
// raw text is read first, so an integer past 2^53 keeps its digits.
func WholeNumber(v gjson.Result) (int64, bool) {
	if v.Type != gjson.Number {
		return 0, false
	}
	if n, err := strconv.ParseInt(v.Raw, 10, 64); err == nil {
		return n, true
	}
	f := v.Num
	if f != float64(int64(f)) {
		return 0, false
	}
	return int64(f), true
}
