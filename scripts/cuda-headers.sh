# Sourced by the scripts that compile against the real cuda.h
# (cuda-abi-check.sh, cuda-double.sh): cuda_headers VERSION PACKAGE prints
# the include directory of that NVIDIA pip package's headers, fetched once
# into ~/.cache/kvbm/cuda-headers/VERSION (headers only are kept).
cuda_headers() {
  local root="${KVBM_CACHE:-$HOME/.cache/kvbm}/cuda-headers"
  local dir="$root/$1" tmp
  if [[ ! -f "$dir/include/cudaTypedefs.h" ]]; then
    mkdir -p "$root"
    tmp=$(mktemp -d "$root/.fetch.XXXXXX")
    python3 -m pip download -q --no-deps --dest "$tmp" "$2==$1" >&2
    python3 - "$tmp" "$dir" <<'PY'
import glob, os, sys, zipfile
tmp, dest = sys.argv[1:]
whl = glob.glob(os.path.join(tmp, "*.whl"))[0]
os.makedirs(os.path.join(dest, "include"), exist_ok=True)
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.endswith(".h") and "/include/" in n and "/include/cooperative_groups" not in n:
            with open(os.path.join(dest, "include", os.path.basename(n)), "wb") as f:
                f.write(z.read(n))
PY
    rm -rf "$tmp"
  fi
  echo "$dir/include"
}

