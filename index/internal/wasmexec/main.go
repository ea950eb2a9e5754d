// Command wasmexec runs a GOOS=wasip1 GOARCH=wasm program (typically a
// test binary) on wazero, so the index's tests and benchmarks can be
// measured inside Wasm exactly as they run natively:
//
//	go build -o /tmp/wasmexec ./index/internal/wasmexec
//	GOOS=wasip1 GOARCH=wasm go test -exec /tmp/wasmexec -run '^$' -bench . ./index/
//
// go test calls it with the binary's path followed by the test flags. The
// host's root directory is mounted at / and PWD is set, so testdata
// (fuzz seed corpora) is found. Compiled code is cached under the user
// cache directory: the first run of a new binary compiles for a while.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: wasmexec PROGRAM.wasm [ARGS...]")
		os.Exit(2)
	}
	os.Exit(run(os.Args[1], os.Args[2:]))
}

func run(path string, args []string) int {
	bin, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wasmexec:", err)
		return 2
	}
	ctx := context.Background()
	rc := wazero.NewRuntimeConfig()
	if os.Getenv("WASMEXEC_INTERP") != "" {
		rc = wazero.NewRuntimeConfigInterpreter()
	}
	if dir, err := os.UserCacheDir(); err == nil {
		if cache, err := wazero.NewCompilationCacheWithDir(filepath.Join(dir, "kvroute-wasmexec")); err == nil {
			rc = rc.WithCompilationCache(cache)
		}
	}
	r := wazero.NewRuntimeWithConfig(ctx, rc)
	defer r.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, r)
	if err := instantiateStore(ctx, r); err != nil {
		fmt.Fprintln(os.Stderr, "wasmexec:", err)
		return 2
	}
	compiled, err := r.CompileModule(ctx, bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wasmexec:", err)
		return 2
	}
	if err := instantiateUnimplementedEnv(ctx, r, compiled); err != nil {
		fmt.Fprintln(os.Stderr, "wasmexec:", err)
		return 2
	}
	cwd, _ := os.Getwd()
	cfg := wazero.NewModuleConfig().
		WithArgs(append([]string{filepath.Base(path)}, args...)...).
		WithEnv("PWD", cwd).
		WithStdin(os.Stdin).WithStdout(os.Stdout).WithStderr(os.Stderr).
		WithFSConfig(wazero.NewFSConfig().WithDirMount("/", "/")).
		WithSysWalltime().WithSysNanotime().WithSysNanosleep().
		WithRandSource(rand.Reader)
	_, err = r.InstantiateModule(ctx, compiled, cfg)
	var exit *sys.ExitError
	switch {
	case errors.As(err, &exit):
		return int(exit.ExitCode())
	case err != nil:
		fmt.Fprintln(os.Stderr, "wasmexec:", err)
		return 1
	}
	return 0
}

// instantiateUnimplementedEnv defines every "env" function the program
// imports (the filter package's test binary imports proxy-wasm host
// calls, which its benchmarks never make) as one that answers 12, the
// ABI's Unimplemented, so that such a binary loads here.
func instantiateUnimplementedEnv(ctx context.Context, r wazero.Runtime, m wazero.CompiledModule) error {
	env := r.NewHostModuleBuilder("env")
	n := 0
	for _, f := range m.ImportedFunctions() {
		if mod, name, _ := f.Import(); mod == "env" {
			results := f.ResultTypes()
			env.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, stack []uint64) {
				if len(results) > 0 {
					stack[0] = 12
				}
			}), f.ParamTypes(), results).Export(name)
			n++
		}
	}
	if n == 0 {
		return nil
	}
	_, err := env.Instantiate(ctx)
	return err
}

// hostData is the host side of the "kvroute_store" module: shared data
// kept outside the guest with Envoy's rules (one map behind one mutex,
// CAS 0 or a missing key sets unconditionally, one global CAS counter that
// skips 0), so benchmarks built with -tags kvroute_hoststore pay what a
// proxy_get_shared_data call costs: a host lookup and a copy into guest
// memory.
type hostData struct {
	mu      sync.Mutex
	entries map[string]hostEntry
	next    uint32
}

type hostEntry struct {
	value []byte
	cas   uint32
}

func instantiateStore(ctx context.Context, r wazero.Runtime) error {
	d := &hostData{entries: map[string]hostEntry{}}
	i32 := api.ValueTypeI32
	// GoModuleFunc, not WithFunc: reflection-based host functions cost
	// microseconds per call and would dominate what is measured.
	_, err := r.NewHostModuleBuilder("kvroute_store").
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, st []uint64) {
		st[0] = api.EncodeI32(d.get(ctx, m, uint32(st[0]), uint32(st[1]), uint32(st[2]), uint32(st[3]), uint32(st[4])))
	}), []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i32}).Export("get").
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, st []uint64) {
		st[0] = api.EncodeI32(d.set(ctx, m, uint32(st[0]), uint32(st[1]), uint32(st[2]), uint32(st[3]), uint32(st[4])))
	}), []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i32}).Export("set").
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, _ []uint64) {
		d.reset(ctx, m)
	}), nil, nil).Export("reset").
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, st []uint64) {
		st[0] = uint64(processCPU())
	}), nil, []api.ValueType{api.ValueTypeI64}).Export("cpu_ns").
		Instantiate(ctx)
	return err
}

// get copies key's value into buf when it fits and returns its length, or
// -1 when the key is missing.
func (d *hostData) get(_ context.Context, m api.Module, key, keyLen, buf, bufCap, casPtr uint32) int32 {
	mem := m.Memory()
	k, ok := mem.Read(key, keyLen)
	if !ok {
		panic("kvroute_store.get: key out of range")
	}
	d.mu.Lock()
	e, found := d.entries[string(k)]
	d.mu.Unlock()
	if !found {
		return -1
	}
	if uint32(len(e.value)) <= bufCap {
		mem.Write(buf, e.value)
		mem.WriteUint32Le(casPtr, e.cas)
	}
	return int32(len(e.value))
}

// set stores the value under Envoy's CAS rules: 0 on success, 1 on a CAS
// mismatch.
func (d *hostData) set(_ context.Context, m api.Module, key, keyLen, val, valLen, cas uint32) int32 {
	mem := m.Memory()
	k, ok1 := mem.Read(key, keyLen)
	v, ok2 := mem.Read(val, valLen)
	if !ok1 || !ok2 {
		panic("kvroute_store.set: argument out of range")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	e, found := d.entries[string(k)]
	if found && cas != 0 && cas != e.cas {
		return 1
	}
	d.next++
	if d.next == 0 {
		d.next = 1
	}
	d.entries[string(k)] = hostEntry{value: append(e.value[:0:0], v...), cas: d.next}
	return 0
}

// reset empties the map, so that each benchmark starts from its own state.
func (d *hostData) reset(context.Context, api.Module) {
	d.mu.Lock()
	clear(d.entries)
	d.mu.Unlock()
}
