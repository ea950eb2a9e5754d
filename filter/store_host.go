//go:build wasip1 && !tinygo

package filter

import (
	"unsafe"

	"github.com/kvroute/kvroute/filter/hostbuf"
)

// hostGetSharedData and hostSetSharedData are the host calls behind the SDK's
// GetSharedData and SetSharedData, imported here so that the index's reads and
// writes (about ten per routed request) go straight to the host: through the
// SDK each call also enters its status-to-error mapping, its buffer handover
// and, for a missing key, an interface comparison, code each request would
// enter (docs/performance.md).
//
//go:wasmimport env proxy_get_shared_data
func hostGetSharedData(key *byte, keySize uint32, retPtr, retSize, retCAS *uint32) uint32

//go:wasmimport env proxy_set_shared_data
func hostSetSharedData(key *byte, keySize uint32, value *byte, valueSize uint32, cas uint32) uint32

// sharedPtr, sharedSize and sharedCAS receive a get's answer; package-level
// for the reason headerMapPtr is.
var sharedPtr, sharedSize, sharedCAS uint32

// readShared reads key's value into the spare capacity of dst (lent to the
// ABI bridge) and returns how many bytes the host wrote there, with the
// value's CAS and the host's status. n is -1 when the answer did not land
// there (no spare capacity, a value larger than it, a status other than
// OK and NotFound): the caller then asks again through the SDK. One
// return and plain results: in Wasm each return site copies them out.
func readShared(dst []byte, key string) (n int, cas, status uint32) {
	n = -1
	free := dst[len(dst):cap(dst)]
	if len(free) > 0 {
		hostbuf.Lend(free)
		status = hostGetSharedData(unsafe.StringData(key), uint32(len(key)), &sharedPtr, &sharedSize, &sharedCAS)
		hostbuf.Lend(nil)
		size := int(sharedSize)
		// The bridge hands the host the start of the lent buffer (see
		// hostbuf.Take): the value is in dst exactly when it starts there.
		inDst := size <= len(free) && sharedPtr == uint32(uintptr(unsafe.Pointer(unsafe.SliceData(free))))
		if status == statusNotFound || (status == statusOK && (size == 0 || inDst)) {
			n, cas = size, sharedCAS
		}
		sharedPtr, sharedSize, sharedCAS = 0, 0, 0
	}
	return n, cas, status
}

// writeShared sets key to value through the host and returns its status;
// done is always true here (the SDK's path is for other builds).
func writeShared(key string, value []byte, cas uint32) (status uint32, done bool) {
	return hostSetSharedData(unsafe.StringData(key), uint32(len(key)), unsafe.SliceData(value), uint32(len(value)), cas), true
}
