#!/usr/bin/env bash
# A current UCX beside Debian's 1.13: NVIDIA's libucx-cu12 wheel from PyPI
# (pinned), unpacked once under ~/.cache/kvbm/ucx-<version>. Prints the path
# of its libucp.so.0, for KVBM_UCX_LIB. The wheel is built without verbs and
# rdmacm: it has tcp, shared memory (sysv, posix, cma) and CUDA transports,
# no InfiniBand/RoCE.
set -euo pipefail
version=1.22.0
dir="${KVBM_CACHE:-$HOME/.cache/kvbm}/ucx-$version"
lib="$dir/libucx/lib/libucp.so.0"
if [[ ! -f "$lib" ]]; then
  mkdir -p "$(dirname "$dir")"
  tmp=$(mktemp -d "$(dirname "$dir")/.ucx.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: --dest "$tmp/whl" "libucx-cu12==$version" >&2
  python3 -m zipfile -e "$tmp"/whl/libucx_cu12-*.whl "$tmp/unpacked"
  chmod +x "$tmp"/unpacked/libucx/bin/*
  rm -rf "$dir"
  mv "$tmp/unpacked" "$dir"
fi
echo "$lib"
