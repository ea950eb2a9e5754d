package buildinfo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// WasmSection is the name of the custom section that carries a module's
// Info as JSON. Custom sections are part of the Wasm binary format and
// ignored by every runtime (Envoy's V8, wazero), so the record costs the
// module's memory and start-up nothing.
const WasmSection = "kvroute.buildinfo"

// wasmHeader is the magic number and version 1 every binary module starts with.
var wasmHeader = []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}

// ErrNoWasmInfo means the module is valid but carries no WasmSection: it
// was not built by internal/deploy/wasmbuild (make wasm).
var ErrNoWasmInfo = errors.New("the module carries no kvroute build information (" + WasmSection + " section); modules built by make wasm carry it")

// AppendToWasm returns module with info appended as a WasmSection custom
// section. A module that already carries one is refused: two records would
// leave the reader to guess.
func AppendToWasm(module []byte, info Info) ([]byte, error) {
	if _, err := FromWasm(module); !errors.Is(err, ErrNoWasmInfo) {
		if err == nil {
			return nil, fmt.Errorf("the module already carries a %s section", WasmSection)
		}
		return nil, err
	}
	payload, err := json.Marshal(info)
	if err != nil {
		return nil, err
	}
	content := appendULEB(nil, uint32(len(WasmSection)))
	content = append(content, WasmSection...)
	content = append(content, payload...)
	out := make([]byte, 0, len(module)+len(content)+6)
	out = append(out, module...)
	out = append(out, 0) // custom section id
	out = appendULEB(out, uint32(len(content)))
	return append(out, content...), nil
}

// FromWasm reads the Info a module carries. It walks the module's section
// headers only (a few hundred bytes of reads for a 5 MB module).
func FromWasm(module []byte) (Info, error) {
	if len(module) < len(wasmHeader) || !bytes.Equal(module[:len(wasmHeader)], wasmHeader) {
		return Info{}, errors.New("not a binary Wasm module (no \\0asm version 1 header)")
	}
	p := len(wasmHeader)
	for p < len(module) {
		id := module[p]
		size, n, err := readULEB(module[p+1:])
		if err != nil {
			return Info{}, fmt.Errorf("section at byte %d: %w", p, err)
		}
		start := p + 1 + n
		end := start + int(size)
		if end > len(module) || end < start {
			return Info{}, fmt.Errorf("section at byte %d runs past the end of the module (truncated file?)", p)
		}
		if id == 0 {
			nameLen, m, err := readULEB(module[start:end])
			if err == nil && start+m+int(nameLen) <= end && string(module[start+m:start+m+int(nameLen)]) == WasmSection {
				var info Info
				if err := json.Unmarshal(module[start+m+int(nameLen):end], &info); err != nil {
					return Info{}, fmt.Errorf("%s section: %w", WasmSection, err)
				}
				return info, nil
			}
		}
		p = end
	}
	return Info{}, ErrNoWasmInfo
}

func appendULEB(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			c |= 0x80
		}
		b = append(b, c)
		if v == 0 {
			return b
		}
	}
}

// readULEB decodes an unsigned LEB128 u32, returning it and its length.
func readULEB(b []byte) (uint32, int, error) {
	var v uint32
	for i := 0; i < 5 && i < len(b); i++ {
		v |= uint32(b[i]&0x7f) << (7 * i)
		if b[i]&0x80 == 0 {
			return v, i + 1, nil
		}
	}
	return 0, 0, errors.New("bad LEB128 length")
}
