#!/usr/bin/env bash
# Checks that the kvbm_* symbols libkvbm.so exports are exactly the
# functions include/kvbm.h declares: nothing undeclared leaks out and
# nothing declared is missing.
#
# Usage: scripts/check-symbols.sh [path/to/libkvbm.so] [path/to/kvbm.h]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
lib=${1:-$root/build/libkvbm.so}
header=${2:-$root/include/kvbm.h}
cc=${CC:-cc}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Declared: preprocess (drops comments and macros), then take every
# kvbm_ identifier that is followed by an opening parenthesis.
"$cc" -E -P -x c "$header" | tr -s ' \t\n' ' ' |
  grep -oE '\bkvbm_[a-z0-9_]+ ?\(' | sed -E 's/ ?\($//' | sort -u >"$tmp/declared"

# Exported: defined dynamic symbols of the library.
nm -D --defined-only "$lib" | awk '{print $NF}' | grep -E '^kvbm_' | sort -u >"$tmp/exported"

if ! diff -u "$tmp/declared" "$tmp/exported" >"$tmp/diff"; then
  echo "check-symbols: $lib and $header disagree (- declared only, + exported only):" >&2
  grep -E '^[-+]kvbm_' "$tmp/diff" >&2
  exit 1
fi

# Nothing may link against CUDA or NVML: the library must load without an
# NVIDIA driver (ctypes loads with RTLD_NOW).
if nm -D --undefined-only "$lib" | grep -Eq '\b(cu|nvml)[A-Z][A-Za-z0-9_]*'; then
  echo "check-symbols: $lib has undefined CUDA/NVML symbols:" >&2
  nm -D --undefined-only "$lib" | grep -E '\b(cu|nvml)[A-Z]' >&2
  exit 1
fi
if readelf -d "$lib" | grep -Eq 'NEEDED.*(libcuda|libnvidia-ml|libcudart)'; then
  echo "check-symbols: $lib depends on a CUDA library:" >&2
  readelf -d "$lib" | grep NEEDED >&2
  exit 1
fi

echo "check-symbols: $(wc -l <"$tmp/exported") kvbm_* symbols match $header"
