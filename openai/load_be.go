//go:build armbe || arm64be || m68k || mips || mips64 || mips64p32 || ppc || ppc64 || s390 || s390x || shbe || sparc || sparc64

package openai

import "encoding/binary"

// load64 returns b[i:i+8] as a little-endian word (see load_le.go).
func load64(b []byte, i int) uint64 { return binary.LittleEndian.Uint64(b[i:]) }

// load32 is load64 for b[i:i+4].
func load32(b []byte, i int) uint32 { return binary.LittleEndian.Uint32(b[i:]) }

// store64 writes x to b[i:i+8] as a little-endian word, as load64 reads.
func store64(b []byte, i int, x uint64) { binary.LittleEndian.PutUint64(b[i:], x) }

// store32 is store64 for b[i:i+4].
func store32(b []byte, i int, x uint32) { binary.LittleEndian.PutUint32(b[i:], x) }
