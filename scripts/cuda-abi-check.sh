#!/usr/bin/env bash
# Checks the driver ABI kvbm declares by hand (cuda/real_abi.h) against the
# real cuda.h and cudaTypedefs.h of CUDA 12.8 and 13.0, taken from NVIDIA's
# pip packages (nvidia-cuda-runtime-cu12, nvidia-cuda-runtime: headers only
# are kept, under ~/.cache/kvbm/cuda-headers/, fetched once): compiling
# cuda/abicheck/abicheck.c is the check. Then the check is checked: each
# of a few mutations of real_abi.h (a field's size, a constant, a parameter,
# a symbol's version) must make it fail.
set -euo pipefail
cd "$(dirname "$0")/.."
CC="${CC:-gcc}"

source scripts/cuda-headers.sh

# nvml.h: go-nvml's copy (the module kvbm already depends on).
nvml=$(go list -m -f '{{.Dir}}' github.com/NVIDIA/go-nvml)/pkg/nvml

check() { # check INCLUDE_DIR SOURCE_DIR: compile the check against that cuda.h
  "$CC" -std=c11 -fsyntax-only -Wall -Werror -I "$1" -I "$nvml" "$2/cuda/abicheck/abicheck.c"
}

incs=("$(cuda_headers 12.8.90 nvidia-cuda-runtime-cu12)" "$(cuda_headers 13.0.96 nvidia-cuda-runtime)")
for inc in "${incs[@]}"; do
  check "$inc" . || { echo "cuda-abi-check: cuda/real_abi.h does not match $inc/cuda.h" >&2; exit 1; }
done
echo "cuda-abi-check: cuda/real_abi.h matches cuda.h of CUDA 12.8 and 13.0 and nvml.h (structs, constants, every dlsym'd function's type)"

# The check must fail on each of these.
mutations=(
  's/^\tint id;$/\tshort id;/'
  's/KV_CUDA_ERROR_NOT_READY = 600/KV_CUDA_ERROR_NOT_READY = 601/'
  's/X(cuStreamWaitEvent, (CUstream, CUevent, unsigned))/X(cuStreamWaitEvent, (CUstream, CUevent, size_t))/'
  's/X(cuMemcpyDtoHAsync_v2, (void \*, CUdeviceptr, size_t, CUstream))/X(cuMemcpyDtoHAsync_v2, (CUdeviceptr, void *, size_t, CUstream))/'
  's/X(cuDevicePrimaryCtxRelease_v2, /X(cuDevicePrimaryCtxRelease, /'
  's/char reserved\[64\];/char reserved[32];/'
  's/unsigned long long total, free, used;/unsigned long long total, used, free;/'
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/cuda/abicheck"
cp cuda/abicheck/abicheck.c "$tmp/cuda/abicheck/"
for m in "${mutations[@]}"; do
  sed "$m" cuda/real_abi.h > "$tmp/cuda/real_abi.h"
  if cmp -s cuda/real_abi.h "$tmp/cuda/real_abi.h"; then
    echo "cuda-abi-check: mutation '$m' changed nothing in real_abi.h (update the list)" >&2; exit 1
  fi
  if check "${incs[0]}" "$tmp" 2>/dev/null; then
    echo "cuda-abi-check: the check passed real_abi.h mutated by '$m'" >&2; exit 1
  fi
done
echo "cuda-abi-check: each of ${#mutations[@]} mutations of real_abi.h fails the check"
