//go:build armbe || arm64be || m68k || mips || mips64 || mips64p32 || ppc || ppc64 || s390 || s390x || shbe || sparc || sparc64

package openai

import "encoding/binary"

// load64 returns b[i:i+8] as a little-endian word (see load_le.go).
func load64(b []byte, i int) uint64 { return binary.LittleEndian.Uint64(b[i:]) }
