#!/usr/bin/env bash
# The real CUDA backend (cuda/real_*.go) over the CUDA double: a
# libcuda.so.1 and libnvidia-ml.so.1 that run on the CPU
# (cuda/testdriver/), built against the real cuda.h of CUDA 13.0 (the
# headers scripts/cuda-abi-check.sh fetches) into build/cuda-double/VARIANT.
#
#   scripts/cuda-double.sh build VARIANT...  build those variants
#   scripts/cuda-double.sh test              what `make test-cuda-double` runs
#                                            (needs build/libkvbm.so and $PYBIN,
#                                            a python with kvbmgo: make py-venv)
#
# Variants: default (a CUDA 13.0 driver: both cuMemcpyBatchAsync), cuda12
# (12.8: the one with failIdx), old (10.2: no cuDevicePrimaryCtxRelease_v2),
# and three broken drivers that the conformance suite must catch:
# broken-order (a stream runs its newest work first), broken-wait
# (cuStreamWaitEvent does nothing), broken-short (copies one byte short).
set -euo pipefail
cd "$(dirname "$0")/.."
CC="${CC:-gcc}"
GO="${GO:-go}"
PYBIN="${PYBIN:-build/pyvenv/bin/python}"
out=build/cuda-double
source scripts/cuda-headers.sh

declare -A flags=(
  [default]=""
  [cuda12]="-DKVD_CUDA12"
  [old]="-DKVD_CUDA10"
  [broken-order]="-DKVD_BREAK_STREAM_ORDER"
  [broken-wait]="-DKVD_BREAK_EVENT_WAIT"
  [broken-short]="-DKVD_BREAK_SHORT_COPY"
)
# Symbols a variant's driver does not have.
declare -A omit=(
  [cuda12]="cuMemcpyBatchAsync_v2"
  [old]="cuDevicePrimaryCtxRelease_v2 cuMemcpyBatchAsync cuMemcpyBatchAsync_v2"
)

# build VARIANT: build/cuda-double/VARIANT/{libcuda.so.1,libnvidia-ml.so.1}.
# Only the driver's entry points (cu*) are exported, less the variant's
# omitted ones.
build() {
  local v=$1 dir="$out/$1" inc nvml
  [[ -v "flags[$v]" ]] || { echo "cuda-double: unknown variant $v" >&2; exit 2; }
  inc=$(cuda_headers 13.0.96 nvidia-cuda-runtime)
  nvml=$("$GO" list -m -f '{{.Dir}}' github.com/NVIDIA/go-nvml)/pkg/nvml
  mkdir -p "$dir/obj"
  local objs=()
  for src in context stream memory module; do
    # shellcheck disable=SC2086
    "$CC" -std=c11 -O2 -g -Wall -Wextra -Werror -fPIC -pthread -I "$inc" ${flags[$v]} \
      -c "cuda/testdriver/$src.c" -o "$dir/obj/$src.o"
    objs+=("$dir/obj/$src.o")
  done
  {
    echo "{ global:"
    nm -g --defined-only "${objs[@]}" |
      awk -v omit=" ${omit[$v]:-} " '$2 == "T" && $3 ~ /^cu/ && index(omit, " " $3 " ") == 0 { print "  " $3 ";" }'
    echo "local: *; };"
  } > "$dir/obj/exports.map"
  "$CC" -shared -pthread -Wl,-soname,libcuda.so.1 -Wl,--version-script="$dir/obj/exports.map" \
    -o "$dir/libcuda.so.1" "${objs[@]}"
  "$CC" -std=c11 -O2 -g -Wall -Wextra -Werror -fPIC -shared -I "$nvml" -Wl,-soname,libnvidia-ml.so.1 \
    -o "$dir/libnvidia-ml.so.1" cuda/testdriver/nvml.c
}

# expect_fail VARIANT: the conformance suite must fail over that driver.
# Slow copies (1 GB/s) and three runs: a wait that is ignored shows only
# when the consumer's copy starts before the producer's ends, which slow
# copies make all but certain, whatever the load of the machine.
expect_fail() {
  local log="$out/$1/conformance.log"
  if (cd cuda && env "${double_env[@]}" KVBM_CUDA_DOUBLE_PS_PER_BYTE=1000 LD_LIBRARY_PATH="$PWD/../$out/$1" \
        "../$out/cuda.test" -test.run '^TestRealConformance$' -test.count=3 >"../$log" 2>&1); then
    echo "cuda-double: the conformance suite passed over the $1 driver (see $log)" >&2
    exit 1
  fi
  echo "cuda-double: the $1 driver fails the conformance suite, as it must: $(grep -m1 -- '--- FAIL: TestRealConformance/' "$log" | sed 's/^ *//')"
}

# Copies take time (20 GB/s): work that is not ordered after a copy sees
# the bytes it had before, as on a GPU, instead of a race it usually wins.
double_env=(KVBM_DEVICE=cuda KVBM_CUDA_DOUBLE_PS_PER_BYTE=50)

# exports_match_abi: the default double exports exactly the calls kvbm
# resolves (cuda/real_abi.h's lists): one kvbm adds is missing here loudly.
exports_match_abi() {
  local want have
  want=$(grep -oE 'X\((cu|nvml)[A-Za-z0-9_]+' cuda/real_abi.h | sed 's/^X(//' | sort)
  have=$(nm -D --defined-only "$out/default/libcuda.so.1" "$out/default/libnvidia-ml.so.1" |
    awk '$2 == "T" { print $3 }' | sort)
  if [[ "$want" != "$have" ]]; then
    echo "cuda-double: the double's exports differ from the calls cuda/real_abi.h resolves:" >&2
    diff <(echo "$want") <(echo "$have") >&2 || true
    exit 1
  fi
}

run_tests() {
  for v in "${!flags[@]}"; do build "$v"; done
  exports_match_abi
  local lib="$PWD/$out/default"
  # The double's own rules (its loud refusals on stderr are expected).
  "$CC" -std=c11 -O1 -g -Wall -Wextra -Werror -I "$(cuda_headers 13.0.96 nvidia-cuda-runtime)" \
    cuda/testdriver/selftest.c -o "$out/selftest" -L"$lib" -l:libcuda.so.1 -ldl
  LD_LIBRARY_PATH="$lib" "$out/selftest" cuda/kernels/copy.ptx
  "$GO" test -c -race -o "$out/cuda.test" ./cuda
  # The real backend's own tests on two devices, every path on: the batch
  # API, CUDA IPC.
  rm -f "$out"/trace-*
  (cd cuda && env "${double_env[@]}" KVBM_CUDA_DOUBLE_DEVICES=2 KVBM_CUDA_MEMCPY_BATCH=1 KVBM_CUDA_IPC=1 \
    KVBM_CUDA_DOUBLE_TRACE="$PWD/../$out/trace-cuda" LD_LIBRARY_PATH="$lib" \
    "../$out/cuda.test" -test.run '^TestReal' -test.count=1)
  # CUDA 12.8's cuMemcpyBatchAsync (with failIdx).
  (cd cuda && env "${double_env[@]}" KVBM_CUDA_MEMCPY_BATCH=1 LD_LIBRARY_PATH="$PWD/../$out/cuda12" \
    KVBM_CUDA_DOUBLE_TRACE="$PWD/../$out/trace-cuda12" \
    "../$out/cuda.test" -test.run '^TestRealConformanceBatchAPI$' -test.count=1)
  for v in broken-order broken-wait broken-short; do expect_fail "$v"; done
  # The transfer manager and the workers over it: the same tests as on the
  # emulated device (KVBM_DEVICE=cuda makes their fixtures open the driver);
  # G1 crosses processes by CUDA IPC.
  env "${double_env[@]}" KVBM_CUDA_IPC=1 KVBM_CUDA_DOUBLE_TRACE="$PWD/$out/trace-core" LD_LIBRARY_PATH="$lib" \
    "$GO" test -race -count=1 ./core/transfer ./core/worker
  # The C examples through libkvbm.so, G1 in the double's device memory
  # (examples/c/g1.h), and kvbmgo: a worker, and a too-old driver's error.
  cmake -S . -B "$out/cmake" -DKVBM_LIBRARY="$PWD/build/libkvbm.so" >/dev/null
  cmake --build "$out/cmake" -j >/dev/null
  env "${double_env[@]}" KVBM_CUDA_IPC=1 KVBM_CUDA_DOUBLE_TRACE="$PWD/$out/trace-examples" LD_LIBRARY_PATH="$lib" \
    ctest --test-dir "$out/cmake" --output-on-failure
  (cd python && KVBM_CUDA_DOUBLE="$PWD/../$out" KVBM_CUDA_DOUBLE_TRACE="$PWD/../$out/trace-python" \
    "../$PYBIN" -m pytest -q -p no:cacheprovider tests/test_cuda_double.py)
  coverage
}

# coverage prints, for every driver call kvbm resolves (the double's
# exports), how many processes of each run above called it.
coverage() {
  echo "cuda-double: processes that called each driver call (cuda: the real backend's tests; cuda12; core: core/transfer and core/worker; examples: the C examples; python: kvbmgo):"
  nm -D --defined-only "$out/default/libcuda.so.1" | awk '$2 == "T" { print $3 }' | sort | while read -r sym; do
    local line="" g n
    for g in cuda cuda12 core examples python; do
      n=$(awk -v s="$sym" '$1 == s { n++ } END { print n + 0 }' "$out/trace-$g" 2>/dev/null || echo 0)
      line+=" $g=$n"
    done
    printf '  %-32s%s\n' "$sym" "$line"
  done
}

case "${1:-}" in
  build) shift; for v in "$@"; do build "$v"; done ;;
  test) run_tests ;;
  *) echo "usage: $0 build VARIANT... | test" >&2; exit 2 ;;
esac
