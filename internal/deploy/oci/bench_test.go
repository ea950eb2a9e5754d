package oci

import (
	"compress/gzip"
	"os"
	"testing"
)

// BenchmarkPluginLayer compares the layer's gzip levels on the real module
// (dist/kvroute.wasm; a synthetic one when it is not built): time per build
// and the layer size, so the choice of level is a measured one.
//
//	go test -run '^$' -bench PluginLayer ./internal/deploy/oci
func BenchmarkPluginLayer(b *testing.B) {
	module, err := os.ReadFile("../../../dist/kvroute.wasm")
	if err != nil {
		module = syntheticModule(5, 4<<20)
	}
	for _, c := range []struct {
		name  string
		level int
	}{{"default", gzip.DefaultCompression}, {"best", gzip.BestCompression}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(module)))
			var size int
			for b.Loop() {
				layer, err := pluginLayerLevel(module, c.level)
				if err != nil {
					b.Fatal(err)
				}
				size = len(layer)
			}
			b.ReportMetric(float64(size), "layer-bytes")
		})
	}
}
