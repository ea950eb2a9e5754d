package dispatch

// prefixMemory remembers which host last served a prompt, keyed by the
// block hashes at power-of-two positions of its chain (blocks 8, 16, 32,
// ...), in a fixed direct-mapped table: no allocation, bounded memory
// (memorySlots entries of a hash and a string header), old entries simply
// overwritten by newer ones that land in the same slot.
//
// A lookup probes the new chain's positions from the deepest down and
// returns the host of the deepest one remembered. Turn N+1 of a chat shares
// its chain with turn N up to turn N's end, so it finds turn N's host even
// after the index has forgotten turn N's blocks. The shallowest key is 8
// blocks deep (2 KB of prompt with the default hashing) so that a short
// shared system prompt does not pull every request to one host; the
// profile's cost and guard weigh against the pull as they do against any
// affinity.
type prefixMemory struct {
	keys  [memorySlots]uint64
	addrs [memorySlots]string
}

const (
	memorySlots    = 1 << 14
	memorySlotBits = 14
	memoryMinDepth = 8 // blocks
)

func (m *prefixMemory) slot(h uint64) int {
	return int((h * 0x9e3779b97f4a7c15) >> (64 - memorySlotBits))
}

func (m *prefixMemory) store(chain []uint64, addr string) {
	for p := memoryMinDepth; p <= len(chain); p *= 2 {
		k := chain[p-1]
		i := m.slot(k)
		m.keys[i], m.addrs[i] = k, addr
	}
}

func (m *prefixMemory) lookup(chain []uint64) string {
	if len(chain) < memoryMinDepth {
		return ""
	}
	p := memoryMinDepth
	for p*2 <= len(chain) {
		p *= 2
	}
	for ; p >= memoryMinDepth; p /= 2 {
		k := chain[p-1]
		if i := m.slot(k); k != 0 && m.keys[i] == k {
			return m.addrs[i]
		}
	}
	return ""
}
