//go:build !(wasip1 && kvroute_hoststore)

package index

func benchStore() Store { return &MemStore{} }

func resetBenchStore() {}
