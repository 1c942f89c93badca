# C ABI targets, included from the top Makefile: `make lib`, `make test-c`.
# (Not `make -f Makefile -f capi.mk`: that reads this file twice.)
#
#   lib       build/libkvbm.so (go build -buildmode=c-shared), exporting only
#             the kvbm_* functions (capi/libkvbm.map), + symbol check
#   test-c    lib, then the C examples under ctest, plain and with ASan/UBSan
#   bench-c   ns per call from C, beside an empty C call
#   install-c install the library, header, CMake package and kvbm.pc
#             under PREFIX
#   fuzz-c    libFuzzer over the ABI's input paths for FUZZ_SECONDS
#             (examples/c/fuzz; installs clang from Debian's packages)

GO      ?= go
BUILD   ?= build
CMAKE   ?= cmake
CTEST   ?= ctest
CC      ?= cc
PREFIX  ?= /usr/local

.PHONY: lib test-c bench-c install-c fuzz-c

# Always runs go build: Go's build cache decides what is stale, including
# changes under core/ and cuda/.
lib:
	@mkdir -p $(BUILD)
	$(GO) build -buildmode=c-shared \
	  -ldflags='-extldflags "-Wl,-soname,libkvbm.so -Wl,--version-script=$(CURDIR)/capi/libkvbm.map"' \
	  -o $(BUILD)/libkvbm.so ./capi
	@rm -f $(BUILD)/libkvbm.h # cgo's header names internal symbols; include/kvbm.h is the contract
	scripts/check-symbols.sh $(BUILD)/libkvbm.so include/kvbm.h
	python3 -c "import ctypes; ctypes.CDLL('$(BUILD)/libkvbm.so')"

test-c: lib
	$(CMAKE) -S . -B $(BUILD)/cmake -DKVBM_LIBRARY=$(abspath $(BUILD)/libkvbm.so)
	$(CMAKE) --build $(BUILD)/cmake -j
	$(CTEST) --test-dir $(BUILD)/cmake --output-on-failure
	$(CMAKE) -S . -B $(BUILD)/cmake-asan -DKVBM_SANITIZE=ON -DKVBM_LIBRARY=$(abspath $(BUILD)/libkvbm.so)
	$(CMAKE) --build $(BUILD)/cmake-asan -j
	$(CTEST) --test-dir $(BUILD)/cmake-asan --output-on-failure

bench-c: lib
	$(CC) -O2 -std=c11 -Iinclude examples/c/bench/bench.c examples/c/bench/empty.c -pthread \
	  -L$(BUILD) -lkvbm -Wl,-rpath,$(abspath $(BUILD)) -o $(BUILD)/bench-c
	$(BUILD)/bench-c

install-c: lib
	$(CMAKE) -S . -B $(BUILD)/cmake -DKVBM_LIBRARY=$(abspath $(BUILD)/libkvbm.so) -DCMAKE_INSTALL_PREFIX=$(PREFIX)
	$(CMAKE) --install $(BUILD)/cmake

FUZZ_SECONDS ?= 30

fuzz-c: lib
	@command -v clang >/dev/null || (apt-get update && apt-get install -y --no-install-recommends clang libclang-rt-14-dev)
	clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude examples/c/fuzz/fuzz_abi.c \
	  -L$(BUILD) -lkvbm -Wl,-rpath,$(abspath $(BUILD)) -o $(BUILD)/fuzz_abi
	@mkdir -p $(BUILD)/fuzz-corpus
	cd $(BUILD) && ASAN_OPTIONS=detect_leaks=0 ./fuzz_abi -max_total_time=$(FUZZ_SECONDS) -timeout=20 fuzz-corpus
