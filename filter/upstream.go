package filter

import (
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
)

// responseStatusAndPeer reads the response's :status (0 when unreadable)
// and the address that served it (primary when the host does not say).
// Both values land in p.hostVal and are dropped here: the address returned
// is primary or the candidate's own string, so nothing is allocated unless
// a host outside the candidate set answered.
func (p *routerPlugin) responseStatusAndPeer(primary string) (status int, served string) {
	if v, ok := readResponseHeader(p.hostVal, ":status"); ok && len(v) == 3 {
		if n, ok := decimal(unsafeString(v)); ok && n >= 100 {
			status = int(n)
		}
	}
	v, err := readUpstreamAddress(p.hostVal)
	if addr, _ := splitRank(primary); err != nil || len(v) == 0 || string(v) == addr {
		return status, primary
	}
	return status, p.otherPeer(v)
}

// otherPeer is the address of a peer other than the primary (a fallback
// took the request): the candidate's own string, or a copy of v for a host
// outside the candidate set. Out of line (noinline), as only a fallback
// needs it.
//
//go:noinline
func (p *routerPlugin) otherPeer(v []byte) string {
	if i, known := p.pos[string(v)]; known {
		return p.hosts[i].Address
	}
	return string(v)
}

// sdkUpstreamAddress reads upstream.address through the SDK: outside the
// official Go Wasm build, and when the in-place read cannot serve.
// Out of line (noinline): in Wasm only a response without the property
// gets here.
//
//go:noinline
func sdkUpstreamAddress() ([]byte, error) {
	return proxywasm.GetProperty(upstreamAddressPath)
}

// upstreamAddressPath is the property Envoy sets to the upstream host that
// took the request.
var upstreamAddressPath = []string{"upstream", "address"}
