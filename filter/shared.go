package filter

import (
	"encoding/binary"
	"errors"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// sharedCounter is a uint64 in proxy-wasm shared data, incremented with
// compare-and-set so every worker VM of the vm_id sees one sequence (Envoy runs
// one VM per worker; a per-VM counter would make round robin uneven when the
// workers get uneven traffic).
type sharedCounter struct {
	key string
	// local is used when shared data keeps failing, so a request is never
	// refused for lack of a counter.
	local uint64
	// casRetries counts lost races (visible as kvroute.*.cas_retries).
	casRetries interface{ Increment(uint64) }
}

const maxCASAttempts = 8

// next returns the counter's value before incrementing it.
func (c *sharedCounter) next() uint64 {
	var buf [8]byte
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		value, cas, err := proxywasm.GetSharedData(c.key)
		var n uint64
		switch {
		case err == nil && len(value) == 8:
			n = binary.LittleEndian.Uint64(value)
		case err == nil || errors.Is(err, types.ErrorStatusNotFound):
			// Missing or malformed: start over at zero. cas is 0 for a missing
			// key, which Envoy treats as "set unconditionally".
		default:
			return c.fallback()
		}
		binary.LittleEndian.PutUint64(buf[:], n+1)
		err = proxywasm.SetSharedData(c.key, buf[:], cas)
		if err == nil {
			return n
		}
		if !errors.Is(err, types.ErrorStatusCasMismatch) {
			return c.fallback()
		}
		if c.casRetries != nil {
			c.casRetries.Increment(1)
		}
	}
	return c.fallback()
}

func (c *sharedCounter) fallback() uint64 {
	c.local++
	return c.local - 1
}
