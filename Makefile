# kvroute: the two commands that matter are `make demo` and `make test`.
# Install and release targets: docs/install.md.
GO ?= go
# ENVOY_COMPAT=1.35 selects the envoy-compat build of the Wasm module, for Envoy 1.33 to 1.38
# (any version in that range builds the same module). Each build has its own files:
#   standard      dist/kvroute.wasm               dist/kvroute-oci.tar               kvroute:VERSION
#   envoy-compat  dist/kvroute-envoy-compat.wasm  dist/kvroute-envoy-compat-oci.tar  kvroute:VERSION-envoy-compat
ENVOY_COMPAT ?=
VARIANT_SUFFIX = $(if $(ENVOY_COMPAT),-envoy-compat,)
WASM = dist/kvroute$(VARIANT_SUFFIX).wasm
OCI_ARCHIVE = dist/kvroute$(VARIANT_SUFFIX)-oci.tar
# The metrics service image (envoy/kubernetes/metrics.yaml: REGISTRY/kvroute-metrics:TAG).
PLATFORMS ?= linux/amd64,linux/arm64
# The Mooncake JSONL trace `make bench` replays (8 replicas, every strategy);
# required: make bench TRACE=path/to/trace.jsonl.
TRACE ?=

.PHONY: all wasm wasm-tinygo test demo bench bench-topology bench-knee bench-knee-seeds fuzz oci image release vet clean

all: wasm

# dist/kvroute.wasm (or the envoy-compat module): official Go toolchain, wasip1,
# c-shared, ABI bridge overlay (docs/wasm-build.md).
wasm:
	$(GO) run ./internal/deploy/wasmbuild -out $(WASM) $(if $(ENVOY_COMPAT),-envoy-compat $(ENVOY_COMPAT),)

# dist/kvroute-tinygo.wasm for users with TinyGo >= 0.32 (the SDK's own //export
# path; no bridge). Not tested here: TinyGo cannot be installed on our machines.
wasm-tinygo:
	@command -v tinygo >/dev/null || { echo "wasm-tinygo: needs TinyGo >= 0.32 on PATH (untested in kvroute CI; use 'make wasm' otherwise)"; exit 1; }
	mkdir -p dist && tinygo build -o dist/kvroute-tinygo.wasm -scheduler=none -target=wasip1 -ldflags="-X 'main.build=(tinygo build)'" ./filter/module

# Every test, including the Wasm integration tests (which need the standard
# dist/kvroute.wasm, whatever ENVOY_COMPAT says) and the fuzz seed corpora.
test:
	$(GO) run ./internal/deploy/wasmbuild
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 20m ./...

demo:
	$(GO) run ./internal/deploy/wasmbuild
	$(GO) run ./cmd/kvroute demo

# need-trace stops a target before any work when TRACE is not a readable file.
need-trace = @test -n "$(TRACE)" && test -r "$(TRACE)" || { echo 'make $@: set TRACE to a readable Mooncake JSONL trace (one {"timestamp", "input_length", "output_length", "hash_ids"} object per line), e.g. make $@ TRACE=conversation_trace.jsonl from github.com/kvcache-ai/Mooncake (FAST25-release/traces); without a trace, go run ./cmd/kvroute bench --workload shared-prefix replays a generated workload'; exit 2; }

bench:
	$(need-trace)
	$(GO) run ./internal/deploy/wasmbuild
	$(GO) test -run '^$$' -bench . -benchmem ./...
	$(GO) run ./cmd/kvroute bench --trace $(TRACE) --replicas 8 --out dist/bench.json
	$(MAKE) bench-topology

# The production shapes of docs/topology.md: G gateways x W workers, rate
# scales 1 and 2, every strategy (docs/performance.md, "Topology").
.PHONY: bench-topology
bench-topology:
	$(need-trace)
	mkdir -p dist && for rs in 1 2; do for gw in 1x1 1x4 2x4 4x8; do \
	  $(GO) run ./cmd/kvroute bench --trace $(TRACE) --replicas 8 --rate-scale $$rs --gateways $${gw%x*} --workers $${gw#*x} \
	    --out dist/bench-topology-r$$rs-$$gw.json || exit 1; done; done

# Round robin's knee on the trace (rate scales 1.3-1.5) at 1x1, 2x4 and 4x8:
# the default profile against round robin and the peers (docs/performance.md,
# "Round robin's knee").
.PHONY: bench-knee
bench-knee:
	$(need-trace)
	mkdir -p dist && for rs in 1.3 1.4 1.5; do for gw in 1x1 2x4 4x8; do \
	  $(GO) run ./cmd/kvroute bench --trace $(TRACE) --replicas 8 --rate-scale $$rs --gateways $${gw%x*} --workers $${gw#*x} \
	    --strategies round_robin,kv_cache_aware,dynamo_kv,gie_default,sglang_cache_aware \
	    --out dist/bench-knee-r$$rs-$$gw.json || exit 1; done; done

# The default profile's hit ratio against the pooled ceiling at the knee in
# every run: rate scales 1.3-1.5 x 1x1, 2x4, 4x8 x seeds 1-5 (docs/performance.md,
# "Round robin's knee"); one line per run: its kv_cache_aware row and the ceiling.
.PHONY: bench-knee-seeds
bench-knee-seeds:
	$(need-trace)
	mkdir -p dist && for rs in 1.3 1.4 1.5; do for gw in 1x1 2x4 4x8; do for seed in 1 2 3 4 5; do \
	  echo "rate scale $$rs, $$gw, seed $$seed:"; \
	  $(GO) run ./cmd/kvroute bench --trace $(TRACE) --replicas 8 --rate-scale $$rs --gateways $${gw%x*} --workers $${gw#*x} \
	    --seed $$seed --strategies kv_cache_aware --out dist/bench-knee-seeds-r$$rs-$$gw-s$$seed.json | grep -E '^\| kv_cache_aware|^ceiling' \
	    || exit 1; done; done; done

# Aggregated vs disaggregated fleets of 8 on the trace (kvroute.pd: docs/prefill-decode.md).
.PHONY: bench-pd
bench-pd:
	$(need-trace)
	mkdir -p dist && KVROUTE_PD_BENCH=1 KVROUTE_PD_TRACE=$(abspath $(TRACE)) KVROUTE_PD_OUT=$(CURDIR)/dist/bench-pd.md $(GO) test -count=1 -run '^TestPDBenchMooncake$$' -v -timeout 60m ./internal/sim/fleet

# Each fuzz target's time goes to fuzzing: by default Go spends up to 60 s
# minimising each new interesting input, which on a 2-core machine took most
# of a 30 s target's time. FUZZFLAGS adds flags to every target.
FUZZMINIMIZE ?= 2s
FUZZFLAGS ?= -fuzzminimizetime $(FUZZMINIMIZE)

fuzz:
	for f in FuzzParseRequest FuzzPromptMatchesGJSONReading FuzzValidJSON FuzzWalkerMatchesGJSON FuzzScrub FuzzReadBudget FuzzCachedTokensAcrossChunks; do $(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime 30s $(FUZZFLAGS) ./openai || exit 1; done
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeSnapshot$$' -fuzztime 30s $(FUZZFLAGS) ./snapshot
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 30s $(FUZZFLAGS) ./config
	$(GO) test -run '^$$' -fuzz '^FuzzParseORCA$$' -fuzztime 30s $(FUZZFLAGS) ./health
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime 60s $(FUZZFLAGS) ./scorer
	for f in FuzzSharedValues FuzzShardCodec FuzzSlotCodec FuzzHasherPrefixStable; do $(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime 60s $(FUZZFLAGS) ./index || exit 1; done
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime 60s $(FUZZFLAGS) ./internal/metricsvc/kvevents
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 60s $(FUZZFLAGS) ./internal/metricsvc/scrape
	$(GO) test -run '^$$' -fuzz '^FuzzPDRewrite$$' -fuzztime 60s $(FUZZFLAGS) ./openai
	$(GO) test -run '^$$' -fuzz '^FuzzReadMooncake$$' -fuzztime 30s $(FUZZFLAGS) ./internal/sim/workload
	$(GO) test -run '^$$' -fuzz '^FuzzRequestBody$$' -fuzztime 30s $(FUZZFLAGS) -parallel 1 ./internal/sim/server

# The Wasm module of the variant asked for, as an OCI image archive.
oci: wasm
	$(GO) run ./cmd/kvroute oci build --wasm $(WASM) --out $(OCI_ARCHIVE)

# dist/kvroute-metrics-oci.tar: the metrics service image for every platform
# in PLATFORMS, built without a container engine (internal/deploy/distbuild).
image:
	$(GO) run ./internal/deploy/distbuild image -out dist/kvroute-metrics-oci.tar -platforms $(PLATFORMS)

# dist/release/: both Wasm modules and their OCI archives, the metrics image,
# the CLI for every platform in PLATFORMS, and SHA256SUMS.
release:
	$(MAKE) oci ENVOY_COMPAT=
	$(MAKE) oci ENVOY_COMPAT=1.35
	$(GO) run ./internal/deploy/distbuild release -dir dist/release -platforms $(PLATFORMS) \
		dist/kvroute.wasm dist/kvroute-oci.tar dist/kvroute-envoy-compat.wasm dist/kvroute-envoy-compat-oci.tar

clean:
	rm -rf dist .wasmbuild
