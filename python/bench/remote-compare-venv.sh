#!/usr/bin/env bash
# remote-compare-venv.sh — print the path of the venv that
# python/bench/remote_compare.py runs in, creating it first if it is absent or
# was left half-built (same scheme as scripts/engine-venv.sh).
#
# It lives outside the clone ($KVBM_ENGINE_VENV_DIR, default $HOME/.cache/kvbm,
# as venv-bench-remote) and is the same for every checkout: numpy, plus NIXL
# and Mooncake's transfer engine when the index offers them for this host.
# NIXL is installed without its dependencies: nixl-cu12 names torch (and so
# several GB of CUDA wheels) but imports it only for type checking, and the
# benchmark passes numpy arrays. Mooncake's few dependencies come along.
# Those two are optional: a package that does not install is recorded in
# $venv/.kvbm-missing (one "name: reason" a line) and the benchmark prints the
# reason instead of its figures. kvbmgo is not installed into it: the
# benchmark imports it from python/ and loads this checkout's build/libkvbm.so.
#
# Exit status: 0 and the venv path on stdout; 1 with the reason on stderr.
set -euo pipefail

root=${KVBM_ENGINE_VENV_DIR:-$HOME/.cache/kvbm}
venv="$root/venv-bench-remote"
marker="$venv/.kvbm-complete"
# "pip-args|module": what to install, then what must import afterwards.
optional=("--no-deps nixl-cu12==1.5.1|nixl_cu12" "mooncake-transfer-engine-non-cuda==0.3.13.post1|mooncake.engine")
want="numpy ${optional[*]}"

if [[ -f "$marker" && "$(cat "$marker")" == "$want" ]]; then
  echo "$venv"
  exit 0
fi

py=${KVBM_BENCH_PYTHON:-}
if [[ -z "$py" ]]; then
  for cand in python3.12 python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 &&
       "$cand" -c 'import sys; sys.exit(0 if (3,9) <= sys.version_info[:2] else 1)' 2>/dev/null; then
      py=$cand; break
    fi
  done
fi
if [[ -z "$py" ]]; then
  echo "remote-compare-venv.sh: no python >=3.9 found" >&2
  exit 1
fi

mkdir -p "$root"
exec 9>"$venv.lock"
flock 9
if [[ -f "$marker" && "$(cat "$marker")" == "$want" ]]; then
  echo "$venv"
  exit 0
fi

log="$venv.log"
echo "remote-compare-venv.sh: building $venv (log: $log)" >&2
start=$(date +%s)
rm -rf "$venv"
{
  "$py" -m venv "$venv" &&
  "$venv/bin/python" -m pip install --quiet --upgrade pip &&
  "$venv/bin/python" -m pip install --quiet numpy
} >"$log" 2>&1 || {
  echo "remote-compare-venv.sh: building $venv failed; last lines of $log:" >&2
  tail -n 20 "$log" >&2
  exit 1
}
: >"$venv/.kvbm-missing"
for opt in "${optional[@]}"; do
  args=${opt%%|*} module=${opt##*|}
  pkg=${args##* }
  # shellcheck disable=SC2086 # args is words on purpose
  if ! "$venv/bin/python" -m pip install --quiet $args >>"$log" 2>&1; then
    reason=$(grep -E 'ERROR' "$log" | tail -n 1 | cut -c1-200)
    echo "${pkg%%==*}: pip install $pkg failed: ${reason:-see $log}" >>"$venv/.kvbm-missing"
    echo "remote-compare-venv.sh: $pkg did not install (the benchmark skips it)" >&2
  elif ! "$venv/bin/python" -c "import $module" >>"$log" 2>&1; then
    echo "${pkg%%==*}: installed, but import $module failed: $(tail -n 1 "$log" | cut -c1-200)" >>"$venv/.kvbm-missing"
  fi
done
echo "$want" >"$marker"
echo "remote-compare-venv.sh: built $venv in $(( $(date +%s) - start )) s" >&2
echo "$venv"
