//go:build armbe || arm64be || m68k || mips || mips64 || mips64p32 || ppc || ppc64 || s390 || s390x || shbe || sparc || sparc64

package openai

import (
	"encoding/binary"
	"unsafe"
)

// load64 returns b[i:i+8] as a little-endian word (see load_le.go).
func load64(b []byte, i int) uint64 { return binary.LittleEndian.Uint64(b[i:]) }

// load32 is load64 for b[i:i+4].
func load32(b []byte, i int) uint32 { return binary.LittleEndian.Uint32(b[i:]) }

// bytesAt is the n bytes at p+i (see loadAt in load_le.go).
func bytesAt(p unsafe.Pointer, i, n int) []byte { return unsafe.Slice((*byte)(unsafe.Add(p, i)), n) }

// loadAt returns the 8 bytes at p+i as a little-endian word.
func loadAt(p unsafe.Pointer, i int) uint64 { return binary.LittleEndian.Uint64(bytesAt(p, i, 8)) }

// loadAt32 returns the 4 bytes at p+i as a little-endian word.
func loadAt32(p unsafe.Pointer, i int) uint32 { return binary.LittleEndian.Uint32(bytesAt(p, i, 4)) }

// loadAt16 returns the 2 bytes at p+i as a little-endian word.
func loadAt16(p unsafe.Pointer, i int) uint16 { return binary.LittleEndian.Uint16(bytesAt(p, i, 2)) }

// storeAt writes x to the 8 bytes at p+i as a little-endian word.
func storeAt(p unsafe.Pointer, i int, x uint64) { binary.LittleEndian.PutUint64(bytesAt(p, i, 8), x) }

// storeAt32 writes x to the 4 bytes at p+i as a little-endian word.
func storeAt32(p unsafe.Pointer, i int, x uint32) { binary.LittleEndian.PutUint32(bytesAt(p, i, 4), x) }
