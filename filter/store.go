package filter

import (
	"errors"
	"fmt"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/filter/hostbuf"
	"github.com/kvroute/kvroute/index"
)

// sharedStore is index.Store over proxy-wasm shared data: the one map all
// worker VMs of the vm_id see.
type sharedStore struct {
	// emulated adapts to the SDK's proxytest emulator, which differs from
	// Envoy in two ways that matter here: it hands out its own storage from
	// get (Envoy copies into the VM), and it stores a new key's CAS as the
	// given CAS + 1, so the index's create CAS (^uint32(0)) wraps to 0 and
	// the key can never be updated again. Set only by tests.
	emulated bool
}

// The index holds a *sharedStore: behind the interface, methods on a value
// would be called through generated (*sharedStore) wrappers, two more
// functions entered per request in Wasm.
var _ index.AppendGetter = (*sharedStore)(nil)

func (st *sharedStore) Get(key string) ([]byte, uint32, error) {
	v, cas, err := proxywasm.GetSharedData(key)
	if err != nil {
		return nil, 0, getError(key, err)
	}
	if st.emulated {
		v = append([]byte(nil), v...)
	}
	return v, cas, nil
}

// getError maps a failed shared-data get to the index's errors.
func getError(key string, err error) error {
	// The SDK returns the sentinel itself: compare before errors.Is, whose
	// type assertions are not free in Wasm (a miss costs one per decision:
	// the state generation of a gateway without pushed state).
	if err == types.ErrorStatusNotFound {
		// The index asks for keys that are not there on every new
		// prompt's blocks: no formatting (fmt is slow in Wasm) on this path.
		return index.ErrNotFound
	}
	return otherGetError(key, err)
}

// otherGetError is getError for anything but the bare not-found sentinel. It
// is out of line (hence noinline) because a routed request meets a missing key
// on every decision and other errors almost never: each function entered costs
// a request (docs/performance.md), and errors.Is and fmt are most of this
// code.
//
//go:noinline
func otherGetError(key string, err error) error {
	if errors.Is(err, types.ErrorStatusNotFound) {
		return index.ErrNotFound
	}
	return fmt.Errorf("shared data %s: %w", key, err)
}

// Statuses of the proxy-wasm ABI that kvroute's own host calls tell apart.
const (
	statusOK          = 0
	statusNotFound    = 1
	statusCasMismatch = 8
)

// Buffer types of the proxy-wasm ABI that the router reads.
const (
	bufferRequestBody  = 0
	bufferResponseBody = 1
)

// GetAppend implements index.AppendGetter: the host copies the value
// straight into dst's array (lent to the ABI bridge through hostbuf) when
// it fits, instead of into a fresh allocation per read. A new 8K-token
// prompt reads about a dozen 1 KB shard values; the index reuses its
// buffers request after request, so in Wasm those reads stop allocating.
// In the official Go Wasm build the read is kvroute's own host call
// (readShared); anything it cannot settle goes through the SDK.
func (st *sharedStore) GetAppend(dst []byte, key string) (v []byte, cas uint32, err error) {
	n, cas, status := readShared(dst, key)
	switch {
	case n < 0:
		v, cas, err = st.sdkGetAppend(dst, key)
	case status == statusNotFound:
		v, err = dst, index.ErrNotFound
	default:
		v = dst[:len(dst)+n] // the host wrote into dst
	}
	return v, cas, err // one return: in Wasm each return site copies the results out
}

// sdkGetAppend is GetAppend through the SDK: outside the official Go Wasm
// build, and in it for a value that did not fit dst's spare capacity or a
// status other than OK and NotFound. Out of line (noinline): in Wasm, once
// the index's buffers have grown, reads never get here.
//
//go:noinline
func (st *sharedStore) sdkGetAppend(dst []byte, key string) (v []byte, cas uint32, err error) {
	n := len(dst)
	if cap(dst) > n {
		hostbuf.Lend(dst[n:cap(dst)])
	}
	v, cas, err = proxywasm.GetSharedData(key)
	hostbuf.Lend(nil)
	// One return: in Wasm each return site copies the three results out.
	switch {
	case err != nil:
		v, cas, err = dst, 0, getError(key, err)
	case len(v) > 0 && cap(dst) > n && &v[0] == &dst[n : n+1][0]:
		v = dst[:n+len(v)] // the host wrote into dst
	default:
		v = st.appendValue(dst, v)
	}
	return v, cas, err
}

// appendValue is GetAppend when the host did not write into dst: the value
// did not fit (the bridge allocated it), is empty, or is the emulator's
// own storage. Out of line (hence noinline) for the reason of
// otherGetError: once the index's buffers have grown, reads fit.
//
//go:noinline
func (st *sharedStore) appendValue(dst, v []byte) []byte {
	if len(dst) == 0 && len(v) > 0 && !st.emulated {
		return v // the bridge allocated it for us
	}
	// The emulator's own storage (never hand it out), or an empty value.
	return append(dst, v...)
}

func (st *sharedStore) Set(key string, value []byte, cas uint32) (err error) {
	if status, done := writeShared(key, value, cas); done {
		if status != statusOK {
			err = setStatusError(key, status)
		}
		return err
	}
	return st.sdkSet(key, value, cas)
}

// hostStatusError describes a host call's failed status. Out of line
// (noinline): a host call that fails is rare, and fmt is code.
//
//go:noinline
func hostStatusError(call string, status uint32) error {
	return fmt.Errorf("%s: status %d", call, status)
}

// setStatusError maps a failed host set to the index's errors. Out of Set
// (hence noinline) for the reason of otherGetError: sets rarely fail.
//
//go:noinline
func setStatusError(key string, status uint32) error {
	if status == statusCasMismatch {
		return index.ErrCASMismatch // the index retries; nothing to format
	}
	return fmt.Errorf("shared data %s: %w", key, hostStatusError("proxy_set_shared_data", status))
}

// sdkSet is Set through the SDK, outside the official Go Wasm build.
func (st *sharedStore) sdkSet(key string, value []byte, cas uint32) error {
	if st.emulated && cas == ^uint32(0) {
		cas = 0 // the emulator creates a missing key with any CAS and refuses 0 on an existing one
	}
	err := proxywasm.SetSharedData(key, value, cas)
	if err != nil {
		err = setError(key, err)
	}
	return err // one return: in Wasm each return site costs code
}

// setError maps a failed shared-data set to the index's errors. Out of
// Set (hence noinline) for the reason of otherGetError: sets rarely fail.
//
//go:noinline
func setError(key string, err error) error {
	if err == types.ErrorStatusCasMismatch || errors.Is(err, types.ErrorStatusCasMismatch) {
		return index.ErrCASMismatch // the index retries; nothing to format
	}
	return fmt.Errorf("shared data %s: %w", key, err)
}
