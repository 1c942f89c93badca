# kvbm — build, test, demo and benchmarks. Every target installs what it
# needs through the ordinary clients (Go modules, Debian and Python packages).

GO        ?= go
BUILD     := build
GOFLAGS_TEST ?= -race -count=1
export GOFLAGS := -mod=mod

.PHONY: all deps deps-c test test-go vet fuzz bench bench-go demo clean

all: lib

include capi.mk
include python.mk
include cuda.mk

deps:
	$(GO) mod download

vet: deps
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...

# The C toolchain for the C examples (present on our machines; installed
# from Debian's packages where it is not).
deps-c:
	@command -v cmake >/dev/null && command -v cc >/dev/null || \
	  (apt-get update && apt-get install -y --no-install-recommends cmake gcc libc6-dev)

# All tests. Runs on a machine without a GPU (emulated device).
test: vet test-go deps-c test-c test-py test-vllm

test-go: deps
	$(GO) test $(GOFLAGS_TEST) ./...

# Fuzz every decoder and the C ABI's input paths for a while (not part of
# `make test`): FUZZTIME per Go target, FUZZ_SECONDS for the ABI.
FUZZTIME ?= 30s
fuzz: deps fuzz-c
	$(GO) test -run '^$$' -fuzz FuzzDecodeMetadata -fuzztime $(FUZZTIME) ./core/worker
	$(GO) test -run '^$$' -fuzz FuzzDecodeObject -fuzztime $(FUZZTIME) ./core/object

# Benchmarks: every figure beside the limit measured in the same run.
bench: bench-go bench-c bench-py

bench-go: deps
	$(GO) test -run '^$$' -bench . -benchtime 3x -count 1 ./core/transfer ./core/object ./cuda ./core/cache
	$(GO) test -run '^$$' -bench . -benchmem ./core/handoff ./core/pool

demo: deps
	$(GO) run ./cmd/kvbm-demo -dir $(BUILD)/demo

clean:
	rm -rf $(BUILD)
