#!/usr/bin/env bash
# Checks that the symbols libkvbm.so exports are exactly the functions
# include/kvbm.h declares: nothing undeclared leaks out (not the Go exports
# kvbmgo_*, which would skip the fork check, nor the runtime's cgo helpers:
# capi/libkvbm.map keeps them local) and nothing declared is missing.
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

# Exported: every defined dynamic symbol of the library, whatever its name.
nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | sort -u >"$tmp/exported"

if ! diff -u "$tmp/declared" "$tmp/exported" >"$tmp/diff"; then
  echo "check-symbols: $lib and $header disagree (- declared only, + exported only):" >&2
  grep -E '^[-+][^-+]' "$tmp/diff" >"$tmp/differ" || true
  sed -n 1,20p "$tmp/differ" >&2
  n=$(wc -l <"$tmp/differ")
  [ "$n" -le 20 ] || echo "... $n in all" >&2
  exit 1
fi

# Nothing may link against CUDA or NVML: the library must load without an
# NVIDIA driver (ctypes loads with RTLD_NOW).
# (Into files first: under pipefail, grep -q closing a pipe early would make
# nm fail with SIGPIPE and the check pass.)
nm -D --undefined-only "$lib" >"$tmp/undefined"
if grep -Eq '\b(cu|nvml)[A-Z][A-Za-z0-9_]*' "$tmp/undefined"; then
  echo "check-symbols: $lib has undefined CUDA/NVML symbols:" >&2
  grep -E '\b(cu|nvml)[A-Z]' "$tmp/undefined" >&2
  exit 1
fi
readelf -d "$lib" >"$tmp/dynamic"
if grep -Eq 'NEEDED.*(libcuda|libnvidia-ml|libcudart)' "$tmp/dynamic"; then
  echo "check-symbols: $lib depends on a CUDA library:" >&2
  grep NEEDED "$tmp/dynamic" >&2
  exit 1
fi

echo "check-symbols: the $(wc -l <"$tmp/exported") exported symbols are the functions of $header"
