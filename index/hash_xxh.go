package index

import "math/bits"

// XXH64 constants (the xxHash specification).
const (
	xxPrime1 uint64 = 0x9E3779B185EBCA87
	xxPrime2 uint64 = 0xC2B2AE3D27D4EB4F
	xxPrime3 uint64 = 0x165667B19E3779F9
	xxPrime4 uint64 = 0x85EBCA77C2B2AE63
	xxPrime5 uint64 = 0x27D4EB2F165667C5
)

// xxhChain appends to out the hashes of n consecutive blocks of size bytes
// at the start of s, chained: block i is hashed as XXH64 with the hash of
// block i-1 as its seed (seed for the first), which is what xxhash.Digest
// gives after ResetWithSeed, WriteString and Sum64. s must hold n*size
// bytes.
//
// The Hasher hashes every block with it: the blocks that lie whole inside
// one string (most blocks of a long prompt) straight from the string, one
// call for all the blocks of one size, and a block assembled from pieces
// from its pending bytes (xxh64). An xxhash.Digest costs three calls per
// block (Write, Sum64, ResetWithSeed) and its buffering bookkeeping, and in
// Go's Wasm port, where every call and every variable that outlives one
// goes through linear memory, that cost as much as hashing a block's 256
// bytes. Here the blocks are one loop in one function with the
// accumulators in locals, two stripes (64 bytes) per iteration.
// TestXXHChainMatchesDigest checks it against the xxhash package, and
// TestHasherMatchesReference the Hasher against a plain digest per block.
func xxhChain(seed uint64, s string, size, n int, out []uint64) []uint64 {
	for ; n > 0; n-- {
		b := s[:size]
		s = s[size:]
		var h uint64
		if len(b) >= 32 {
			v1 := seed + xxPrime1 + xxPrime2
			v2 := seed + xxPrime2
			v3 := seed
			v4 := seed - xxPrime1
			for len(b) >= 64 {
				w := b[:64]
				v1 = bits.RotateLeft64(v1+le64(w[0:8])*xxPrime2, 31) * xxPrime1
				v2 = bits.RotateLeft64(v2+le64(w[8:16])*xxPrime2, 31) * xxPrime1
				v3 = bits.RotateLeft64(v3+le64(w[16:24])*xxPrime2, 31) * xxPrime1
				v4 = bits.RotateLeft64(v4+le64(w[24:32])*xxPrime2, 31) * xxPrime1
				v1 = bits.RotateLeft64(v1+le64(w[32:40])*xxPrime2, 31) * xxPrime1
				v2 = bits.RotateLeft64(v2+le64(w[40:48])*xxPrime2, 31) * xxPrime1
				v3 = bits.RotateLeft64(v3+le64(w[48:56])*xxPrime2, 31) * xxPrime1
				v4 = bits.RotateLeft64(v4+le64(w[56:64])*xxPrime2, 31) * xxPrime1
				b = b[64:]
			}
			if len(b) >= 32 {
				w := b[:32]
				v1 = bits.RotateLeft64(v1+le64(w[0:8])*xxPrime2, 31) * xxPrime1
				v2 = bits.RotateLeft64(v2+le64(w[8:16])*xxPrime2, 31) * xxPrime1
				v3 = bits.RotateLeft64(v3+le64(w[16:24])*xxPrime2, 31) * xxPrime1
				v4 = bits.RotateLeft64(v4+le64(w[24:32])*xxPrime2, 31) * xxPrime1
				b = b[32:]
			}
			h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
			h = (h^bits.RotateLeft64(v1*xxPrime2, 31)*xxPrime1)*xxPrime1 + xxPrime4
			h = (h^bits.RotateLeft64(v2*xxPrime2, 31)*xxPrime1)*xxPrime1 + xxPrime4
			h = (h^bits.RotateLeft64(v3*xxPrime2, 31)*xxPrime1)*xxPrime1 + xxPrime4
			h = (h^bits.RotateLeft64(v4*xxPrime2, 31)*xxPrime1)*xxPrime1 + xxPrime4
		} else {
			h = seed + xxPrime5
		}
		h += uint64(size)
		for len(b) >= 8 {
			h ^= bits.RotateLeft64(le64(b[:8])*xxPrime2, 31) * xxPrime1
			h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
			b = b[8:]
		}
		if len(b) >= 4 {
			h ^= uint64(le32(b[:4])) * xxPrime1
			h = bits.RotateLeft64(h, 23)*xxPrime2 + xxPrime3
			b = b[4:]
		}
		for i := 0; i < len(b); i++ {
			h ^= uint64(b[i]) * xxPrime5
			h = bits.RotateLeft64(h, 11) * xxPrime1
		}
		h ^= h >> 33
		h *= xxPrime2
		h ^= h >> 29
		h *= xxPrime3
		h ^= h >> 32
		out = append(out, h)
		seed = h
	}
	return out
}

// le64 and le32 read little-endian words of a string (the compiler turns
// them into single loads, natively and in Wasm).
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func le32(s string) uint32 {
	_ = s[3]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}
