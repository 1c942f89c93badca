# kvbm — build, test, demo and benchmarks. Every target installs what it
# needs through the ordinary clients (Go modules, Debian and Python packages).

GO        ?= go
BUILD     := build
GOFLAGS_TEST ?= -race -count=1
export GOFLAGS := -mod=mod
# go-nvml's cgo wraps NVML calls that NVML marks deprecated: their compiler
# warnings are not ours to fix, and would bury the first lines of make demo.
CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
export CGO_CFLAGS

.PHONY: all deps deps-c deps-ucx test test-go vet fuzz soak-late bench bench-go bench-cmd demo kvbm install-cmd clean versitygw

all: lib

# A real S3-compatible server for the S3 store's tests and benchmarks:
# versitygw, built once into a cache outside the clone and reused.
VERSITYGW_VERSION := v1.8.0
KVBM_CACHE ?= $(HOME)/.cache/kvbm
VERSITYGW  ?= $(KVBM_CACHE)/versitygw-$(VERSITYGW_VERSION)/versitygw
WITH_S3    := VERSITYGW=$(VERSITYGW) scripts/with-s3.sh

$(VERSITYGW):
	GOFLAGS= GOBIN=$(dir $@) $(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)

versitygw: $(VERSITYGW)

include capi.mk
include python.mk
include cuda.mk

deps:
	$(GO) mod download

vet: deps
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run ./scripts/floors

# The C toolchain for the C examples (present on our machines; installed
# from Debian's packages where it is not).
deps-c:
	@command -v cmake >/dev/null && command -v cc >/dev/null || \
	  (apt-get update && apt-get install -y --no-install-recommends cmake gcc libc6-dev)

# UCX for the UCX transport (core/remote/ucx): Debian's libucx0, opened
# with dlopen at run time (nothing links against it), installed where
# missing. KVBM_UCX_LIB names another libucp (a CUDA/RDMA build) instead.
deps-ucx:
	@[ -n "$$KVBM_UCX_LIB" ] || ldconfig -p | grep -q 'libucp\.so\.0 ' || \
	  (apt-get update && apt-get install -y --no-install-recommends libucx0)

# All tests. Runs on a machine without a GPU (emulated device).
test: vet test-cuda-abi test-cuda-double test-go deps-c test-c test-py test-wheel test-vllm test-sglang test-e2e

# KVBM_REQUIRE_S3=1: an S3 test that finds no server fails instead of skipping.
# KVBM_REQUIRE_UCX=1 (set by CI): a UCX test that cannot load libucp fails.
# The UCX transport's tests run apart from the other packages (whose
# allocations hold the host's memory lock, internal/memavail, for as long
# as they go on: a helper process waited 48 s for it, past a hello's
# deadline), with Debian's 1.13 and again with a current UCX (1.22, from
# PyPI: scripts/ucx-current.sh).
test-go: deps deps-ucx $(VERSITYGW)
	KVBM_REQUIRE_S3=1 $(WITH_S3) $(GO) test $(GOFLAGS_TEST) $$($(GO) list ./... | grep -v '/core/remote/ucx$$')
	$(GO) test $(GOFLAGS_TEST) ./core/remote/ucx
	KVBM_UCX_LIB=$$(scripts/ucx-current.sh) $(GO) test $(GOFLAGS_TEST) ./core/remote/ucx

# Fuzz every decoder and the C ABI's input paths for a while (not part of
# `make test`): FUZZTIME per Go target, FUZZ_SECONDS for the ABI.
FUZZTIME ?= 30s
# The late-answer test, 100 rounds a case (each: a pull failed at its
# deadline, the exporting process stopped, then run again; every byte of
# the destination checked after its late answer): TCP, same host, and UCX's
# message mode over shared memory and tcp, with Debian's UCX and 1.22.
soak-late: deps deps-ucx
	KVBM_REQUIRE_UCX=1 KVBM_TEST_LATE_ROUNDS=100 $(GO) test -count=1 -timeout 60m -run TestNoByteOfAFailedPullLandsAfterItCompletes ./core/worker
	KVBM_REQUIRE_UCX=1 KVBM_TEST_LATE_ROUNDS=100 KVBM_UCX_LIB=$$(scripts/ucx-current.sh) $(GO) test -count=1 -timeout 60m -run 'TestNoByteOfAFailedPullLandsAfterItCompletes/ucx_(sm|tcp)' ./core/worker

fuzz: deps fuzz-c
	$(GO) test -run '^$$' -fuzz FuzzDecodeMetadata -fuzztime $(FUZZTIME) ./core/worker
	$(GO) test -run '^$$' -fuzz FuzzDecodeObject -fuzztime $(FUZZTIME) ./core/object
	$(GO) test -run '^$$' -fuzz FuzzUpdate -fuzztime $(FUZZTIME) ./internal/crc32c
	$(GO) test -run '^$$' -fuzz FuzzReadRequest -fuzztime $(FUZZTIME) ./core/remote/tcp
	$(GO) test -run '^$$' -fuzz FuzzTCPEndpoint -fuzztime $(FUZZTIME) ./core/remote/tcp
	$(GO) test -run '^$$' -fuzz FuzzParseHello -fuzztime $(FUZZTIME) ./core/remote/capability
	$(GO) test -run '^$$' -fuzz FuzzParseRegions -fuzztime $(FUZZTIME) ./core/remote/tcp
	$(GO) test -run '^$$' -fuzz FuzzParseScope -fuzztime $(FUZZTIME) ./core/remote/capability
	$(GO) test -run '^$$' -fuzz FuzzDecodeEndpoint -fuzztime $(FUZZTIME) ./core/remote/ucx
	$(GO) test -run '^$$' -fuzz FuzzCheckRkeyFrame -fuzztime $(FUZZTIME) ./core/remote/ucx
	$(GO) test -run '^$$' -fuzz FuzzParseMessage -fuzztime $(FUZZTIME) ./core/remote/ucx
	$(GO) test -run '^$$' -fuzz FuzzSinkUnpack -fuzztime $(FUZZTIME) ./core/remote/ucx
	$(GO) test -run '^$$' -fuzz FuzzAcceptedTakes -fuzztime $(FUZZTIME) ./core/remote/ucx
	$(GO) test -run '^$$' -fuzz FuzzParseMemunits -fuzztime $(FUZZTIME) ./core/remote/ucx
	$(GO) test -run '^$$' -fuzz FuzzHeadSlice -fuzztime $(FUZZTIME) ./core/layout
	$(GO) test -run '^$$' -fuzz FuzzJournalReplay -fuzztime $(FUZZTIME) ./core/cache

# Benchmarks: every figure beside the limit measured in the same run.
bench: bench-go bench-c bench-py bench-cmd bench-remote-compare

# The path benchmarks of the kvbm command, on this machine's device and disk.
bench-cmd: kvbm $(VERSITYGW)
	$(WITH_S3) $(BUILD)/kvbm bench -dir $(BUILD)/bench

bench-go: deps deps-ucx $(VERSITYGW)
	$(WITH_S3) $(GO) test -run '^$$' -bench . -benchtime 3x -count 1 ./core/transfer ./core/object ./cuda ./core/cache ./core/remote/ucx ./internal/memcopy
	$(GO) test -run '^$$' -bench . -benchmem ./core/handoff ./core/pool ./internal/crc32c
	$(GO) test -run '^$$' -bench 'CrossProcess|PeerFailure' -benchtime 3x ./core/worker

# The kvbm command (info, bench, demo): a Go program of its own, never
# linked into libkvbm.so.
kvbm: deps
	$(GO) build -o $(BUILD)/kvbm ./cmd/kvbm

# KVBM_DEMO_S3=1: the G4 scene on S3, a local versitygw started for it.
DEMO_S3 := $(filter 1,$(KVBM_DEMO_S3))
demo: kvbm $(if $(DEMO_S3),$(VERSITYGW))
	$(if $(DEMO_S3),$(WITH_S3)) $(BUILD)/kvbm demo -dir $(BUILD)/demo

# go install ./cmd/kvbm: into GOBIN, or GOPATH/bin.
install-cmd: deps
	$(GO) install ./cmd/kvbm

clean:
	rm -rf $(BUILD)
