//go:build !(armbe || arm64be || m68k || mips || mips64 || mips64p32 || ppc || ppc64 || s390 || s390x || shbe || sparc || sparc64)

package openai

import "unsafe"

// load64 returns b[i:i+8] as a little-endian word. On a little-endian
// machine (Wasm, amd64, arm64) that is one load, and the function is cheap
// enough for Go's inliner, where binary.LittleEndian.Uint64 is not when
// compiling for Wasm (the inliner prices it as eight loads and shifts):
// shortPlain needs to be inlined into the validator and the walker.
func load64(b []byte, i int) uint64 {
	_ = b[i+7] // bounds: one check for the eight bytes
	return *(*uint64)(unsafe.Pointer(&b[i]))
}

// load32 is load64 for b[i:i+4].
func load32(b []byte, i int) uint32 {
	_ = b[i+3]
	return *(*uint32)(unsafe.Pointer(&b[i]))
}

// The loads and stores at p+i below have no bounds test: for indexes a
// test or loop condition before them has covered, where a test per word
// costs a compare and a branch in Wasm.

// loadAt returns the 8 bytes at p+i as a little-endian word.
func loadAt(p unsafe.Pointer, i int) uint64 { return *(*uint64)(unsafe.Add(p, i)) }

// loadAt32 returns the 4 bytes at p+i as a little-endian word.
func loadAt32(p unsafe.Pointer, i int) uint32 { return *(*uint32)(unsafe.Add(p, i)) }

// loadAt16 returns the 2 bytes at p+i as a little-endian word.
func loadAt16(p unsafe.Pointer, i int) uint16 { return *(*uint16)(unsafe.Add(p, i)) }

// storeAt writes x to the 8 bytes at p+i as a little-endian word.
func storeAt(p unsafe.Pointer, i int, x uint64) { *(*uint64)(unsafe.Add(p, i)) = x }

// storeAt32 writes x to the 4 bytes at p+i as a little-endian word.
func storeAt32(p unsafe.Pointer, i int, x uint32) { *(*uint32)(unsafe.Add(p, i)) = x }
